package ep

import (
	"io"
	"time"

	"github.com/goep/goep/ep/driver"
)

// The contract's vocabulary, defined in package driver (which engines
// import) and named here, where programs find it: a Config, its modes,
// layouts and wire formats, tensors and memories, backends and their
// features, and the errors calls return.

type (
	Area             = driver.Area
	Backend          = driver.Backend
	CallKind         = driver.CallKind
	Capable          = driver.Capable
	Combine          = driver.Combine
	Config           = driver.Config
	DeviceTimer      = driver.DeviceTimer
	Dispatch         = driver.Dispatch
	DType            = driver.DType
	Engine           = driver.Engine
	ExpertIDKind     = driver.ExpertIDKind
	Feature          = driver.Feature
	Footprint        = driver.Footprint
	InputError       = driver.InputError
	Masker           = driver.Masker
	Memory           = driver.Memory
	Meter            = driver.Meter
	Mode             = driver.Mode
	NetworkMeter     = driver.NetworkMeter
	OverflowPolicy   = driver.OverflowPolicy
	Placement        = driver.Placement
	Planner          = driver.Planner
	Received         = driver.Received
	RecvLayout       = driver.RecvLayout
	Refusal          = driver.Refusal
	RefusedError     = driver.RefusedError
	Refuser          = driver.Refuser
	Routing          = driver.Routing
	Scalar           = driver.Scalar
	SequenceError    = driver.SequenceError
	Sequencer        = driver.Sequencer
	Span             = driver.Span
	Spec             = driver.Spec
	StateMaker       = driver.StateMaker
	Tensor[T Scalar] = driver.Tensor[T]
	Timeliner        = driver.Timeliner
	TimeoutError     = driver.TimeoutError
	TransferMeter    = driver.TransferMeter
	UnusableError    = driver.UnusableError
	WireFormat       = driver.WireFormat
	WireInfo         = driver.WireInfo
	YPlace           = driver.YPlace
)

const (
	BFloat16                = driver.BFloat16
	CallCombine             = driver.CallCombine
	CallDispatch            = driver.CallDispatch
	DefaultTimeout          = driver.DefaultTimeout
	FeatureCallSequence     = driver.FeatureCallSequence
	FeatureFP8Combine       = driver.FeatureFP8Combine
	FeatureFP8Forward       = driver.FeatureFP8Forward
	FeatureFP8Wire          = driver.FeatureFP8Wire
	FeatureNVFP4Forward     = driver.FeatureNVFP4Forward
	FeatureNVFP4Combine     = driver.FeatureNVFP4Combine
	FeatureGlobalExpertIDs  = driver.FeatureGlobalExpertIDs
	FeatureHTExpertMajor    = driver.FeatureHTExpertMajor
	FeatureLLRankMajor      = driver.FeatureLLRankMajor
	FeatureMaskStalledRanks = driver.FeatureMaskStalledRanks
	FeatureMeter            = driver.FeatureMeter
	FeatureNamedTimeouts    = driver.FeatureNamedTimeouts
	FeatureOverflowDrop     = driver.FeatureOverflowDrop
	FeatureRefusals         = driver.FeatureRefusals
	FeatureZeroAllocs       = driver.FeatureZeroAllocs
	Float32                 = driver.Float32
	GlobalExpertIDs         = driver.GlobalExpertIDs
	HighThroughput          = driver.HighThroughput
	LayoutDefault           = driver.LayoutDefault
	LayoutExpertMajor       = driver.LayoutExpertMajor
	LayoutFlat              = driver.LayoutFlat
	LayoutRankMajor         = driver.LayoutRankMajor
	LocalExpertIDs          = driver.LocalExpertIDs
	LowLatency              = driver.LowLatency
	MaxExperts              = driver.MaxExperts
	MaxTopK                 = driver.MaxTopK
	OverflowDrop            = driver.OverflowDrop
	OverflowFail            = driver.OverflowFail
	ScaleGroup              = driver.ScaleGroup
	WireFP8                 = driver.WireFP8
	WireFP8Forward          = driver.WireFP8Forward
	WireFP8UE8M0            = driver.WireFP8UE8M0
	WireNVFP4Forward        = driver.WireNVFP4Forward
	WireNVFP4               = driver.WireNVFP4
	WireNative              = driver.WireNative
	YElsewhere              = driver.YElsewhere
	YInOutputs              = driver.YInOutputs
	YInRows                 = driver.YInRows
)

var (
	ErrBadInput    = driver.ErrBadInput
	ErrClosed      = driver.ErrClosed
	ErrMasked      = driver.ErrMasked
	ErrMismatch    = driver.ErrMismatch
	ErrTimeout     = driver.ErrTimeout
	ErrUnsupported = driver.ErrUnsupported
	HostMemory     = driver.HostMemory
)

// Alloc returns a zeroed tensor of n elements of T in memory m.
func Alloc[T Scalar](m Memory, n int) (Tensor[T], error) { return driver.Alloc[T](m, n) }

// AsBytes is t viewed as bytes (no copy).
func AsBytes[T Scalar](t Tensor[T]) Tensor[byte] { return driver.AsBytes[T](t) }

// Download copies src into dst on the host (same length).
func Download[T Scalar](dst []T, src Tensor[T]) error { return driver.Download[T](dst, src) }

// Features lists every Feature.
func Features() []Feature { return driver.Features() }

// Free releases a tensor that Alloc returned (nothing for host memory).
func Free[T Scalar](t Tensor[T]) error { return driver.Free[T](t) }

// FromBytes is b viewed as elements of T; b's length must be a multiple of
// T's size.
func FromBytes[T Scalar](b Tensor[byte]) (Tensor[T], error) { return driver.FromBytes[T](b) }

// Host is s as a Tensor in host memory (no copy). Host(nil) is an empty
// tensor, not the zero Tensor.
func Host[T Scalar](s []T) Tensor[T] { return driver.Host[T](s) }

// InputErrorf makes an *InputError, for Engines that refuse an input only
// they can check.
func InputErrorf(op, format string, a ...any) error { return driver.InputErrorf(op, format, a...) }

// OnDevice is the n elements of T at device address addr of memory m.
func OnDevice[T Scalar](m Memory, addr uint64, n int) Tensor[T] {
	return driver.OnDevice[T](m, addr, n)
}

// ParseMode reads "ll" or "ht".
func ParseMode(s string) (Mode, error) { return driver.ParseMode(s) }

// ParseRecvLayout reads "default", "expert-major", "rank-major" or "flat".
func ParseRecvLayout(s string) (RecvLayout, error) { return driver.ParseRecvLayout(s) }

// ParseWire reads a wire format's name ("native", "fp8", ...).
func ParseWire(s string) (WireFormat, error) { return driver.ParseWire(s) }

// Wires lists every wire format; WireFormat.Info says what each is.
func Wires() []WireFormat { return driver.Wires() }

// ScaleGroups is the number of FP8 scales of a row of hidden elements.
func ScaleGroups(hidden int) int { return driver.ScaleGroups(hidden) }

// Supports reports whether backend b implements feature f.
func Supports(b Backend, f Feature) bool { return driver.Supports(b, f) }

// ToHost returns t's elements on the host: t.Host() itself for host memory,
// else a copy.
func ToHost[T Scalar](t Tensor[T]) ([]T, error) { return driver.ToHost[T](t) }

// Upload copies src from the host into dst (same length).
func Upload[T Scalar](dst Tensor[T], src []T) error { return driver.Upload[T](dst, src) }

// WriteTimeline writes spans as a table, times in milliseconds from t0.
func WriteTimeline(w io.Writer, spans []Span, t0 time.Time) error {
	return driver.WriteTimeline(w, spans, t0)
}
