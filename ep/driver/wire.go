package driver

import "fmt"

// WireFormat is how a Group's dispatched rows travel and arrive
// (Config.Wire). Combine always moves the group's element type.
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
)

// ScaleGroup is the number of consecutive elements of a row that share
// one FP8 scale. A row of Hidden elements has ScaleGroups(Hidden) scales;
// when Hidden is not a multiple of ScaleGroup, the last group is shorter.
const ScaleGroup = 128

// ScaleGroups is the number of FP8 scales of a row of hidden elements.
func ScaleGroups(hidden int) int { return (hidden + ScaleGroup - 1) / ScaleGroup }

func (w WireFormat) String() string {
	switch w {
	case WireNative:
		return "native"
	case WireFP8:
		return "fp8"
	case WireFP8UE8M0:
		return "fp8-ue8m0"
	case WireFP8Forward:
		return "fp8-forward"
	}
	return fmt.Sprintf("WireFormat(%d)", int(w))
}

// FP8 reports an FP8 wire format: rows arrive as e4m3 codes and scales.
func (w WireFormat) FP8() bool { return w == WireFP8 || w == WireFP8UE8M0 || w == WireFP8Forward }

// ParseWire reads "native", "fp8", "fp8-ue8m0" or "fp8-forward".
func ParseWire(s string) (WireFormat, error) {
	for _, w := range []WireFormat{WireNative, WireFP8, WireFP8UE8M0, WireFP8Forward} {
		if s == w.String() {
			return w, nil
		}
	}
	return 0, fmt.Errorf("ep: unknown wire format %q (want native, fp8, fp8-ue8m0 or fp8-forward)", s)
}
