package moe

import (
	"math"
	"math/rand/v2"
)

// Params holds the parameters of a MoE layer (or their gradients, or Adam's
// moments): the data-parallel ones, held by every rank (the gate and the
// shared expert), and n routed experts, stored expert-major. A Layer's
// Params hold its rank's LocalExperts experts; a Checkpoint's hold all of
// them, in global order. Without a shared expert (Config.SharedFFN 0) its
// arrays are empty.
type Params struct {
	Gate []float64 // [Hidden][Experts]: logits = x·Gate
	W1   []float64 // [n][Hidden][FFN]
	B1   []float64 // [n][FFN]
	W2   []float64 // [n][FFN][Hidden]
	B2   []float64 // [n][Hidden]

	SharedW1 []float64 // [Hidden][SharedFFN]
	SharedB1 []float64 // [SharedFFN]
	SharedW2 []float64 // [SharedFFN][Hidden]
	SharedB2 []float64 // [Hidden]
}

// newParams allocates zero parameters for n experts.
func newParams(c Config, n int) Params {
	H, F, S := c.Hidden, c.FFN, c.SharedFFN
	p := Params{
		Gate: make([]float64, H*c.Experts),
		W1:   make([]float64, n*H*F), B1: make([]float64, n*F),
		W2: make([]float64, n*F*H), B2: make([]float64, n*H),
	}
	if S > 0 {
		p.SharedW1, p.SharedB1 = make([]float64, H*S), make([]float64, S)
		p.SharedW2, p.SharedB2 = make([]float64, S*H), make([]float64, H)
	}
	return p
}

// slices lists the parameter arrays in a fixed order: Gate, W1, B1, W2, B2,
// SharedW1, SharedB1, SharedW2, SharedB2.
func (p *Params) slices() [][]float64 {
	return [][]float64{p.Gate, p.W1, p.B1, p.W2, p.B2, p.SharedW1, p.SharedB1, p.SharedW2, p.SharedB2}
}

// expertSlices lists the routed experts' arrays: W1, B1, W2, B2.
func (p *Params) expertSlices() [][]float64 { return [][]float64{p.W1, p.B1, p.W2, p.B2} }

// dataParallelSlices lists the arrays every rank holds a copy of, in the
// order of the data-parallel vector: Gate, SharedW1, SharedB1, SharedW2,
// SharedB2.
func (p *Params) dataParallelSlices() [][]float64 {
	return [][]float64{p.Gate, p.SharedW1, p.SharedB1, p.SharedW2, p.SharedB2}
}

// shared returns the view of the shared expert.
func (p *Params) shared() expert {
	return expert{w1: p.SharedW1, b1: p.SharedB1, w2: p.SharedW2, b2: p.SharedB2}
}

// gatherDataParallel copies the data-parallel arrays of p into dst (their
// concatenation, Config.DataParallelParams long).
func (p *Params) gatherDataParallel(dst []float64) {
	for _, s := range p.dataParallelSlices() {
		copy(dst, s)
		dst = dst[len(s):]
	}
}

// scatterDataParallel copies src, a concatenation of the data-parallel
// arrays, into p.
func (p *Params) scatterDataParallel(src []float64) {
	for _, s := range p.dataParallelSlices() {
		copy(s, src)
		src = src[len(s):]
	}
}

// Zero sets every parameter to zero.
func (p *Params) Zero() {
	for _, s := range p.slices() {
		clear(s)
	}
}

// Clone returns a deep copy.
func (p *Params) Clone() Params {
	return Params{Gate: clone(p.Gate), W1: clone(p.W1), B1: clone(p.B1), W2: clone(p.W2), B2: clone(p.B2),
		SharedW1: clone(p.SharedW1), SharedB1: clone(p.SharedB1), SharedW2: clone(p.SharedW2), SharedB2: clone(p.SharedB2)}
}

func clone(s []float64) []float64 { return append([]float64(nil), s...) }

// expert is a view of one expert's arrays inside a Params.
type expert struct{ w1, b1, w2, b2 []float64 }

// expert returns the view of the i-th expert held (0-based among those held).
func (p *Params) expert(c Config, i int) expert {
	H, F := c.Hidden, c.FFN
	return expert{
		w1: p.W1[i*H*F : (i+1)*H*F], b1: p.B1[i*F : (i+1)*F],
		w2: p.W2[i*F*H : (i+1)*F*H], b2: p.B2[i*H : (i+1)*H],
	}
}

// Streams of the random generator, mixed with a seed: each use of randomness
// has its own, so that changing one never shifts another.
const (
	streamGate   = 0x6761746500000000 // "gate"
	streamExpert = 0x6578700000000000 // "exp" + expert index
	streamData   = 0x6461746100000000 // "data" (the global token index mixed in separately)
	streamShared = 0x7368617200000000 // "shar": the shared expert
)

// mix is the SplitMix64 finaliser: a bijection that scatters nearby inputs.
func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// newRand is a PCG generator determined by seed and a stream.
func newRand(seed, stream, sub uint64) *rand.Rand {
	return rand.New(rand.NewPCG(mix(seed^mix(stream)), mix(sub^mix(stream+1))))
}

// seedToken reseeds src for the data token of global index id: the same
// state newRand(seed, streamData, id) starts from, without allocating.
func seedToken(src *rand.PCG, seed, id uint64) {
	src.Seed(mix(seed^mix(streamData)), mix(id^mix(streamData+1)))
}

// scales of the initial parameters.
type initScales struct{ gate, w1, b1, w2, b2 float64 }

// studentInit: a near-uniform router (small gate), unit-variance hidden
// pre-activations, small outputs.
var studentInit = initScales{gate: 0.1, w1: 1, b1: 0, w2: 0.5, b2: 0}

// teacherInit: a decisive router (logits of unit scale) and experts whose
// outputs have unit-order variance, with biases so that experts differ in
// their mean too.
var teacherInit = initScales{gate: 1.5, w1: 1, b1: 0.5, w2: 2, b2: 0.5}

// initParams fills p with random parameters from seed: the gate from its own
// stream, expert e (global index first+i) from the stream of e, so that an
// expert's initial weights do not depend on the number of ranks, and the
// shared expert from a stream of its own. Weights are normal with standard
// deviation scale/sqrt(fan-in); biases normal with standard deviation scale.
func initParams(p *Params, c Config, seed uint64, first int, s initScales) {
	H, F := c.Hidden, c.FFN
	r := newRand(seed, streamGate, 0)
	normal(r, p.Gate, s.gate/math.Sqrt(float64(H)))
	n := len(p.B2) / H
	for i := 0; i < n; i++ {
		initExpert(newRand(seed, streamExpert, uint64(first+i)), p.expert(c, i), H, F, s)
	}
	if c.SharedFFN > 0 {
		initExpert(newRand(seed, streamShared, 0), p.shared(), H, c.SharedFFN, s)
	}
}

// initExpert draws an MLP of width F from r.
func initExpert(r *rand.Rand, e expert, H, F int, s initScales) {
	normal(r, e.w1, s.w1/math.Sqrt(float64(H)))
	normal(r, e.b1, s.b1)
	normal(r, e.w2, s.w2/math.Sqrt(float64(F)))
	normal(r, e.b2, s.b2)
}

func normal(r *rand.Rand, dst []float64, std float64) {
	for i := range dst {
		dst[i] = std * r.NormFloat64()
	}
}
