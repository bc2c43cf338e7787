package driver

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// WireFormat is how a Group's dispatched rows travel and arrive
// (Config.Wire), and how a combine's expert outputs travel
// (Config.CombineWire). What each format is, where it may be used and what
// it asks of a backend is its row of the format table (Info): a new format
// is a row there, the features it asks for, and the engines that declare
// them.
type WireFormat int

// Wire formats.
const (
	// WireNative moves the rows in the group's element type: Recv.
	WireNative WireFormat = iota
	// WireFP8 casts each row to FP8 e4m3 with one float32 scale per group
	// of ScaleGroup consecutive elements, scale = amax/448: RecvFP8 and
	// RecvScales. The cast is fused into the copy that places the row.
	WireFP8
	// WireFP8UE8M0 is WireFP8 with each scale rounded up to a power of two
	// (an 8-bit exponent, UE8M0: the "round scale" of DeepEP), so that a
	// consumer multiplies by it exactly. Its exponent byte is the scale's
	// float32 bits >> 23.
	WireFP8UE8M0
	// WireFP8Forward forwards rows the caller quantized already (NCCL EP's
	// scales-forward recipe): the group's dispatches take e4m3 codes and
	// their float32 scales, one per ScaleGroup elements (DispatchInput.Codes and Scales), and
	// move them as they are, with no cast in ep (any positive scales: a
	// per-128 float32 recipe, or powers of two, UE8M0, which
	// ScalesFromUE8M0 widens exactly); they arrive as RecvFP8 and
	// RecvScales, as with WireFP8.
	WireFP8Forward
	// WireNVFP4Forward forwards rows the caller quantized to NVFP4 (NCCL
	// EP's scales-forward recipe with ncclFloat4x2 tokens): each row is
	// Hidden/2 bytes of FP4 e2m1 codes, two per byte (element 2i in the low
	// nibble, 2i+1 in the high one), with one e4m3 scale byte per 16
	// elements, Hidden/16 bytes of side data; element i is e2m1 code i
	// times scale i/16 (a per-tensor global scale, where the recipe has
	// one, stays the caller's). Hidden must be a multiple of 32 (rows of
	// whole 16-byte pieces). They move as they are (DispatchInput.Packed
	// and PackedScales) and arrive as RecvWire.
	WireNVFP4Forward

	wireEnd // one past the last
)

// WireInfo is one row of the format table: what a wire format is and
// where it may be used.
type WireInfo struct {
	// Name is the format's name in messages and flags (ParseWire), Const
	// that of its constant in package ep.
	Name, Const string
	// Dispatch says the format may be Config.Wire; a group with it needs
	// DispatchFeature of its backend.
	Dispatch        bool
	DispatchFeature Feature
	// Forward says the caller gives the rows already in the format
	// (DispatchInput.Codes, or Packed): the engines move their bytes as
	// they are.
	Forward bool
	// Combine lists the modes in which the format may be Config.CombineWire,
	// each with the feature a group with it needs of its backend (0:
	// none).
	Combine map[Mode]Feature
	// RowBytes is the bytes of a row of hidden elements of elemSize bytes
	// each on the wire; SideBytes those of its side data (its scales),
	// which travel beside it (0: none).
	RowBytes  func(hidden, elemSize int) int
	SideBytes func(hidden int) int
	// CheckHidden refuses a Hidden the format cannot carry (nil: any).
	CheckHidden func(hidden int) error
	// Decode writes the values of one row from its bytes and side data:
	// the format's definition, for readers and tests (nil for
	// WireNative, whose rows are the element type).
	Decode func(dst []float32, row, side []byte)
}

// wires is the format table, indexed by WireFormat.
var wires = [wireEnd]WireInfo{
	WireNative: {
		Name: "native", Const: "WireNative", Dispatch: true,
		Combine:   map[Mode]Feature{LowLatency: 0, HighThroughput: 0},
		RowBytes:  func(hidden, elemSize int) int { return hidden * elemSize },
		SideBytes: func(int) int { return 0 },
	},
	WireFP8: {
		Name: "fp8", Const: "WireFP8", Dispatch: true, DispatchFeature: FeatureFP8Wire,
		Combine:  map[Mode]Feature{LowLatency: FeatureFP8Combine, HighThroughput: FeatureFP8Combine},
		RowBytes: fp8RowBytes, SideBytes: fp8SideBytes, Decode: decodeFP8,
	},
	WireFP8UE8M0: {
		Name: "fp8-ue8m0", Const: "WireFP8UE8M0", Dispatch: true, DispatchFeature: FeatureFP8Wire,
		Combine:  map[Mode]Feature{LowLatency: FeatureFP8Combine, HighThroughput: FeatureFP8Combine},
		RowBytes: fp8RowBytes, SideBytes: fp8SideBytes, Decode: decodeFP8,
	},
	WireFP8Forward: {
		Name: "fp8-forward", Const: "WireFP8Forward", Dispatch: true, DispatchFeature: FeatureFP8Forward, Forward: true,
		RowBytes: fp8RowBytes, SideBytes: fp8SideBytes, Decode: decodeFP8,
	},
	WireNVFP4Forward: {
		Name: "nvfp4-forward", Const: "WireNVFP4Forward", Dispatch: true, DispatchFeature: FeatureNVFP4Forward, Forward: true,
		RowBytes: func(hidden, _ int) int { return hidden / 2 }, SideBytes: func(hidden int) int { return hidden / 16 },
		CheckHidden: func(hidden int) error {
			if hidden%32 != 0 {
				return fmt.Errorf("Hidden = %d is not a multiple of 32 (NVFP4 rows are whole 16-byte pieces)", hidden)
			}
			return nil
		},
		Decode: decodeNVFP4,
	},
}

// Info is w's row of the format table; ok is false for a value that is no
// format.
func (w WireFormat) Info() (info WireInfo, ok bool) {
	if w < 0 || w >= wireEnd {
		return WireInfo{}, false
	}
	return wires[w], true
}

// Wires lists every wire format.
func Wires() []WireFormat {
	ws := make([]WireFormat, wireEnd)
	for i := range ws {
		ws[i] = WireFormat(i)
	}
	return ws
}

// ScaleGroup is the number of consecutive elements of a row that share
// one FP8 scale. A row of Hidden elements has ScaleGroups(Hidden) scales;
// when Hidden is not a multiple of ScaleGroup, the last group is shorter.
const ScaleGroup = 128

// ScaleGroups is the number of FP8 scales of a row of hidden elements.
func ScaleGroups(hidden int) int { return (hidden + ScaleGroup - 1) / ScaleGroup }

func (w WireFormat) String() string {
	if info, ok := w.Info(); ok {
		return info.Name
	}
	return fmt.Sprintf("WireFormat(%d)", int(w))
}

// FP8 reports a format whose rows are e4m3 codes with one float32 scale
// per ScaleGroup elements (RecvFP8, RecvScales).
func (w WireFormat) FP8() bool { return w == WireFP8 || w == WireFP8UE8M0 || w == WireFP8Forward }

// Forward reports a format whose rows the caller gives already in it
// (WireInfo.Forward).
func (w WireFormat) Forward() bool { info, _ := w.Info(); return info.Forward }

// Packed reports a format whose rows are not the element type: they are
// read as bytes with their side data (Handle.RecvWire) and decoded by the
// format's definition.
func (w WireFormat) Packed() bool { return w != WireNative }

// ParseWire reads a format's name.
func ParseWire(s string) (WireFormat, error) {
	names := make([]string, 0, wireEnd)
	for _, w := range Wires() {
		if s == w.String() {
			return w, nil
		}
		names = append(names, w.String())
	}
	return 0, fmt.Errorf("ep: unknown wire format %q (want %s)", s, strings.Join(names, ", "))
}

// checkWires refuses a Config's wire formats that the table does not allow
// for its mode and Hidden.
func (c Config) checkWires(bad func(string, ...any) error) error {
	info, ok := c.Wire.Info()
	if !ok || !info.Dispatch {
		return bad("Wire = %v: choose one of %s", c.Wire, wireNames(func(i WireInfo) bool { return i.Dispatch }))
	}
	if info.CheckHidden != nil {
		if err := info.CheckHidden(c.Hidden); err != nil {
			return bad("Wire %v: %v", c.Wire, err)
		}
	}
	cinfo, ok := c.CombineWire.Info()
	if !ok || len(cinfo.Combine) == 0 {
		return bad("CombineWire = %v: choose one of %s", c.CombineWire, wireNames(func(i WireInfo) bool { return len(i.Combine) > 0 }))
	}
	if _, ok := cinfo.Combine[c.Mode]; !ok {
		return bad("CombineWire %v is not a combine format of %s groups (it is one of %s groups)", c.CombineWire, modeName(c.Mode), combineModes(cinfo))
	}
	if cinfo.CheckHidden != nil {
		if err := cinfo.CheckHidden(c.Hidden); err != nil {
			return bad("CombineWire %v: %v", c.CombineWire, err)
		}
	}
	return nil
}

// wireNames lists the names of the formats the table allows by ok.
func wireNames(ok func(WireInfo) bool) string {
	var names []string
	for _, w := range Wires() {
		if ok(wires[w]) {
			names = append(names, "ep."+wires[w].Const)
		}
	}
	return strings.Join(names, ", ")
}

// combineModes lists the modes in which a combine format may be used.
func combineModes(info WireInfo) string {
	var ms []string
	for _, m := range []Mode{LowLatency, HighThroughput} {
		if _, ok := info.Combine[m]; ok {
			ms = append(ms, modeName(m))
		}
	}
	return strings.Join(ms, " and ")
}

// modeName is m's Go name, for messages.
func modeName(m Mode) string {
	switch m {
	case LowLatency:
		return "LowLatency"
	case HighThroughput:
		return "HighThroughput"
	}
	return m.String()
}

func fp8RowBytes(hidden, _ int) int { return hidden }
func fp8SideBytes(hidden int) int   { return 4 * ScaleGroups(hidden) }

// decodeFP8 is code times the float32 scale of its group of ScaleGroup.
func decodeFP8(dst []float32, row, side []byte) {
	for i, q := range row[:len(dst)] {
		g := 4 * (i / ScaleGroup)
		s := math.Float32frombits(binary.LittleEndian.Uint32(side[g:]))
		dst[i] = DecodeE4M3(q) * s
	}
}

// DecodeE4M3 is the value of FP8 e4m3 code q (OCP's E4M3FN: a sign, 4
// exponent bits of bias 7, 3 mantissa bits, subnormals at exponent 0;
// 0x7F and 0xFF are NaN), exactly.
func DecodeE4M3(q uint8) float32 {
	a := uint32(q & 0x7f)
	var f float32
	switch {
	case a == 0x7f:
		f = float32(math.NaN())
	case a < 8:
		f = float32(a) / 512
	default:
		f = math.Float32frombits(a<<20 + 120<<23)
	}
	if q&0x80 != 0 {
		f = -f
	}
	return f
}

// e2m1Values are the magnitudes of the FP4 e2m1 codes 0-7 (a sign bit
// above them): 2 exponent bits of bias 1, 1 mantissa bit, a subnormal 0.5.
var e2m1Values = [8]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// DecodeE2M1 is the value of FP4 e2m1 code q (its low 4 bits), exactly.
func DecodeE2M1(q uint8) float32 {
	v := e2m1Values[q&7]
	if q&8 != 0 {
		return -v
	}
	return v
}

// decodeNVFP4 is each e2m1 code times the e4m3 scale of its 16 elements.
func decodeNVFP4(dst []float32, row, side []byte) {
	for i := range dst {
		q := row[i/2] >> (4 * (i % 2))
		dst[i] = DecodeE2M1(q) * DecodeE4M3(side[i/16])
	}
}
