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
	// WireNVFP4 is a LowLatency combine format (Config.CombineWire; NCCL
	// EP's NVFP4 combine): each output row is cast to FP4 e2m1 codes, two
	// per byte as in WireNVFP4Forward, with one e4m3 scale per 16 elements
	// and one float32 scale for the row; side data of 4 + Hidden/16 bytes,
	// the row scale first. EncodeNVFP4 defines the cast, the format's
	// Decode the values. Hidden must be a multiple of 32.
	WireNVFP4

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
		CheckHidden: checkNVFP4Hidden, Decode: decodeNVFP4,
	},
	WireNVFP4: {
		Name: "nvfp4", Const: "WireNVFP4",
		Combine:  map[Mode]Feature{LowLatency: FeatureNVFP4Combine},
		RowBytes: func(hidden, _ int) int { return hidden / 2 }, SideBytes: func(hidden int) int { return 4 + hidden/16 },
		CheckHidden: checkNVFP4Hidden, Decode: decodeNVFP4Scaled,
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

// checkNVFP4Hidden refuses a Hidden that is not a whole number of 16-byte
// pieces of NVFP4 codes.
func checkNVFP4Hidden(hidden int) error {
	if hidden%32 != 0 {
		return fmt.Errorf("rows of %d elements are not whole 16-byte pieces of NVFP4 codes (Hidden must be a multiple of 32)", hidden)
	}
	return nil
}

// decodeNVFP4Scaled is WireNVFP4's values: element i is e2m1 code i times
// its block's scale, float32(e4m3(block scale) * row scale), in float32.
func decodeNVFP4Scaled(dst []float32, row, side []byte) {
	g := math.Float32frombits(binary.LittleEndian.Uint32(side))
	for b := 0; b*16 < len(dst); b++ {
		es := DecodeE4M3(side[4+b]) * g
		for i := b * 16; i < (b+1)*16 && i < len(dst); i++ {
			dst[i] = DecodeE2M1(row[i/2]>>(4*(i%2))) * es
		}
	}
}

// EncodeNVFP4 casts a row of float32 values to WireNVFP4 (row: len(src)/2
// bytes of codes, side: 4 + len(src)/16 bytes), the definition the
// engines follow:
//
//   - the row scale is g = amax/2688 in float32 (2688 = 6*448: the largest
//     e2m1 times the largest e4m3), amax the largest |value|; 0 for a row of
//     zeros, whose codes and block scales are then 0;
//   - block b's scale is e4m3 of amax_b/6/g (both divisions in float32),
//     rounded to nearest even, saturating at 448; its effective scale is
//     es = float32(e4m3(scale) * g);
//   - each code is the e2m1 value nearest to value/es (float32), ties to the
//     even code, saturating at ±6; 0 where es is 0.
//
// NaN values are not defined.
func EncodeNVFP4(row, side []byte, src []float32) {
	var amax float32
	for _, v := range src {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	g := amax / 2688
	binary.LittleEndian.PutUint32(side, math.Float32bits(g))
	clear(row[:len(src)/2])
	for b := 0; b*16 < len(src); b++ {
		blk := src[b*16 : min((b+1)*16, len(src))]
		var bmax float32
		for _, v := range blk {
			bmax = max(bmax, float32(math.Abs(float64(v))))
		}
		var sc uint8
		if g > 0 {
			sc = EncodeE4M3(bmax / 6 / g)
		}
		side[4+b] = sc
		es := DecodeE4M3(sc) * g
		for j, v := range blk {
			var q uint8
			if es > 0 {
				q = encodeE2M1(v / es)
			}
			i := b*16 + j
			row[i/2] |= q << (4 * (i % 2))
		}
	}
}

// encodeE2M1 is the e2m1 code nearest to v, ties to the even code (the one
// whose mantissa bit is 0), saturating at ±6.
func encodeE2M1(v float32) uint8 {
	var sign uint8
	if math.Signbit(float64(v)) {
		sign, v = 8, -v
	}
	// Midpoints between consecutive magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6;
	// at a midpoint the even code (0, 1, 2 = 1.0, 4 = 2.0, 6 = 4.0) wins.
	var q uint8
	switch {
	case v < 0.25 || v == 0.25:
		q = 0
	case v < 0.75:
		q = 1
	case v <= 1.25:
		q = 2
	case v < 1.75:
		q = 3
	case v <= 2.5:
		q = 4
	case v < 3.5:
		q = 5
	case v <= 5:
		q = 6
	default:
		q = 7
	}
	return sign | q
}

// EncodeE4M3 rounds f to the nearest e4m3 code, ties to even, saturating
// at ±448; a NaN or an infinity becomes NaN of its sign (e4m3 has no
// infinity). It is the kernels' ep_e4m3_bits.
func EncodeE4M3(f float32) uint8 {
	u := math.Float32bits(f)
	a := u & 0x7fffffff
	var code int32
	if a < 0x3c800000 { // below 2^-6: a multiple of 2^-9, rounded as the float sum does
		code = int32(math.Float32bits(math.Float32frombits(a)*512+8388608) - 0x4b000000)
	} else {
		r := a + 0x7ffff + (a>>20)&1
		code = int32(r>>20) - 120<<3
	}
	code = min(code, 0x7e)
	if a >= 0x7f800000 {
		code = 0x7f
	}
	return uint8((u>>24)&0x80 | uint32(code))
}
