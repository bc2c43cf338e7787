package serve

import (
	"fmt"
	"runtime"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/h5"
	"github.com/goep/goep/moe"
)

// TraceFormat is the value of a serving trace's "format" attribute, and
// TraceVersion of its "version" attribute: the schema in docs/serve.md.
const (
	TraceFormat  = "goep-moe-serve-trace"
	TraceVersion = 1
)

// TraceInfo is what a trace records about its run beside the Result.
type TraceInfo struct {
	Command   string    // the command line
	Start     time.Time // when serving started
	Nodes     int       // nodes the ranks span (simulated ones with GOEP_RANKS_PER_NODE)
	GoVersion string    // the toolchain that built the program (runtime.Version when empty)
}

// WriteTrace writes the run's trace to path, whole or not at all
// (h5.WriteAtomic): the run's configuration and figures as attributes,
// and the tables /steps, /requests, /events and /masking (docs/serve.md).
// Not collective: rank 0 writes it.
func WriteTrace(path string, r *Result, info TraceInfo) error {
	if info.GoVersion == "" {
		info.GoVersion = runtime.Version()
	}
	return h5.WriteAtomic(path, func(f *h5.File) error {
		w := &traceWriter{f: f}
		c, wl, m := r.Config, r.Workload, r.Config.Model
		for _, a := range []struct {
			name  string
			value any
		}{
			{"format", TraceFormat}, {"version", int64(TraceVersion)}, {"command", info.Command},
			{"start_time", info.Start.UTC().Format(time.RFC3339Nano)}, {"go_version", info.GoVersion},
			{"world_size", int64(r.Ranks)}, {"nodes", int64(info.Nodes)}, {"hosts", r.Hosts},
			{"layers", int64(m.Layers)}, {"vocab", int64(m.Vocab)}, {"hidden", int64(m.Hidden)}, {"ffn", int64(m.FFN)},
			{"shared_ffn", int64(m.SharedFFN)}, {"experts", int64(m.Experts)}, {"topk", int64(m.TopK)},
			{"act", m.Act.String()}, {"seed", int64(m.Seed)}, {"checkpoint", c.Checkpoint},
			{"dtype", c.DType.String()}, {"batch", int64(c.Batch)}, {"prefill", c.Prefill.String()},
			{"prefill_tokens", int64(c.PrefillTokens)}, {"overlap", boolInt(c.Overlap)}, {"mask_stalled", boolInt(c.MaskStalled)},
			{"timeout_us", c.Timeout.Microseconds()}, {"control_timeout_us", c.ControlTimeout.Microseconds()},
			{"requests", int64(wl.Requests)}, {"rate", wl.Rate}, {"prompt_min", int64(wl.PromptMin)},
			{"prompt_max", int64(wl.PromptMax)}, {"gen_min", int64(wl.GenMin)}, {"gen_max", int64(wl.GenMax)},
			{"workload_seed", int64(wl.Seed)},
		} {
			w.attr("/", a.name, a.value)
		}
		fig := r.Figures()
		for _, a := range []struct {
			name  string
			value any
		}{
			{"requests", int64(fig.Requests)}, {"tokens", int64(fig.Tokens)}, {"prompt_tokens", int64(fig.PromptTokens)},
			{"elapsed_s", fig.Elapsed.Seconds()}, {"tokens_per_s", fig.TokensPerSecond},
			{"tokens_per_s_per_rank", fig.TokensPerSecondPerRank},
			{"decode_steps", int64(fig.Decode.N)}, {"decode_p50_us", fig.Decode.P50}, {"decode_p90_us", fig.Decode.P90},
			{"decode_p99_us", fig.Decode.P99}, {"decode_max_us", fig.Decode.Max},
			{"prefill_steps", int64(fig.Prefill.N)}, {"prefill_p50_us", fig.Prefill.P50}, {"prefill_p90_us", fig.Prefill.P90},
			{"prefill_p99_us", fig.Prefill.P99}, {"prefill_max_us", fig.Prefill.Max},
			{"ttft_p50_us", fig.TTFT.P50}, {"ttft_p90_us", fig.TTFT.P90}, {"ttft_p99_us", fig.TTFT.P99}, {"ttft_max_us", fig.TTFT.Max},
			{"dropped_pairs", int64(fig.DroppedPairs)}, {"degraded_requests", int64(fig.DegradedRequests)},
			{"steps_short", int64(fig.StepsShort)},
		} {
			w.attr("/summary", a.name, a.value)
		}

		S, R := len(r.Steps), r.Ranks
		step, kind, lat := make([]int64, S), make([]uint8, S), make([]float64, S)
		var rowsV, emitted, dropped, masked []int64
		var start, finish []float64
		for i := range r.Steps {
			s := &r.Steps[i]
			step[i], lat[i] = s.Step, s.LatencyUS()
			if s.Kind == prefillStep.String() {
				kind[i] = 1
			}
			rowsV, emitted = appendInts(rowsV, s.Rows), appendInts(emitted, s.Emitted)
			dropped, masked = appendInts(dropped, s.Dropped), appendInts(masked, s.Masked)
			start, finish = append(start, s.StartUS...), append(finish, s.FinishUS...)
		}
		w.data("steps/step", []int{S}, step)
		w.data("steps/kind", []int{S}, kind)
		w.attr("steps/kind", "values", []string{"decode", "prefill"})
		w.data("steps/latency_us", []int{S}, lat)
		w.data("steps/rows", []int{S, R}, rowsV)
		w.data("steps/emitted", []int{S, R}, emitted)
		w.data("steps/dropped_pairs", []int{S, R}, dropped)
		w.data("steps/masked_ranks", []int{S, R}, masked)
		w.data("steps/start_us", []int{S, R}, start)
		w.data("steps/finish_us", []int{S, R}, finish)

		N := len(r.Requests)
		gen := 1
		for i := range r.Requests {
			gen = max(gen, len(r.Requests[i].Tokens), r.Requests[i].Gen)
		}
		ids, ranks, prompt, genV, drop := make([]int64, N), make([]int64, N), make([]int64, N), make([]int64, N), make([]int64, N)
		arr, adm, first, done, ttft := make([]float64, N), make([]float64, N), make([]float64, N), make([]float64, N), make([]float64, N)
		hash, toks := make([]uint64, N), make([]int32, N*gen)
		for i := range r.Requests {
			q := &r.Requests[i]
			ids[i], ranks[i], prompt[i], genV[i], drop[i] = int64(q.ID), int64(q.Rank), int64(q.Prompt), int64(q.Gen), int64(q.DroppedPairs)
			arr[i], adm[i], first[i], done[i], ttft[i] = q.ArrivalUS, q.AdmittedUS, q.FirstTokenUS, q.DoneUS, q.TTFTUS()
			hash[i] = q.Hash
			row := toks[i*gen : (i+1)*gen]
			for j := range row {
				row[j] = -1
			}
			copy(row, q.Tokens)
		}
		for _, d := range []struct {
			name string
			v    any
		}{{"id", ids}, {"rank", ranks}, {"prompt_tokens", prompt}, {"gen_tokens", genV}, {"dropped_pairs", drop},
			{"arrival_us", arr}, {"admitted_us", adm}, {"first_token_us", first}, {"done_us", done}, {"ttft_us", ttft},
			{"logits_hash", hash}} {
			w.data("requests/"+d.name, []int{N}, d.v)
		}
		w.data("requests/tokens", []int{N, gen}, toks)

		M := len(r.Events)
		eStep, eRank, eLayer, eMB, ePhase := make([]int64, M), make([]int32, M), make([]int32, M), make([]int32, M), make([]int32, M)
		eStart, eFinish := make([]float64, M), make([]float64, M)
		for i, e := range r.Events {
			eStep[i], eRank[i], eLayer[i], eMB[i], ePhase[i] = e.Step, int32(e.Rank), int32(e.Layer), int32(e.MB), int32(e.Phase)
			eStart[i], eFinish[i] = e.StartUS, e.FinishUS
		}
		for _, d := range []struct {
			name string
			v    any
		}{{"step", eStep}, {"rank", eRank}, {"layer", eLayer}, {"micro_batch", eMB}, {"phase", ePhase},
			{"start_us", eStart}, {"finish_us", eFinish}} {
			w.data("events/"+d.name, []int{M}, d.v)
		}
		w.attr("events/phase", "values", PhaseNames())

		X := len(r.Masking)
		mRank, mAt, mBack := make([]int64, X), make([]int64, X), make([]int64, X)
		mAtUS, mBackUS := make([]float64, X), make([]float64, X)
		for i, e := range r.Masking {
			mRank[i], mAt[i], mBack[i], mAtUS[i], mBackUS[i] = int64(e.Rank), e.MaskedAt, e.RejoinedAt, e.MaskedAtUS, e.RejoinedAtUS
		}
		for _, d := range []struct {
			name string
			v    any
		}{{"rank", mRank}, {"masked_at_step", mAt}, {"rejoined_at_step", mBack}, {"masked_at_us", mAtUS}, {"rejoined_at_us", mBackUS}} {
			w.data("masking/"+d.name, []int{X}, d.v)
		}
		return w.err
	})
}

// traceWriter keeps the first error of a sequence of writes.
type traceWriter struct {
	f   *h5.File
	err error
}

func (w *traceWriter) attr(obj, name string, v any) {
	if w.err == nil {
		w.err = w.f.SetAttr(obj, name, v)
	}
}

func (w *traceWriter) data(name string, shape []int, v any) {
	if w.err == nil {
		w.err = w.f.WriteDataset(name, shape, v)
	}
}

func appendInts(dst []int64, src []int) []int64 {
	for _, v := range src {
		dst = append(dst, int64(v))
	}
	return dst
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// ReadTrace reads a serving trace written by WriteTrace. A file that is not
// one, or of another version, is an error saying so.
func ReadTrace(path string) (*Result, *TraceInfo, error) {
	f, err := h5.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	rd := &traceReader{f: f}
	if format := rd.str("/", "format"); rd.err == nil && format != TraceFormat {
		return nil, nil, fmt.Errorf("serve: %s is not a serving trace (format %q, want %q)", path, format, TraceFormat)
	}
	if v := rd.int("/", "version"); rd.err == nil && v != TraceVersion {
		return nil, nil, fmt.Errorf("serve: %s: trace version %d, this program reads version %d", path, v, TraceVersion)
	}
	info := &TraceInfo{Command: rd.str("/", "command"), Nodes: int(rd.int("/", "nodes")), GoVersion: rd.str("/", "go_version")}
	if st := rd.str("/", "start_time"); rd.err == nil {
		if info.Start, err = time.Parse(time.RFC3339Nano, st); err != nil {
			return nil, nil, fmt.Errorf("serve: %s: start_time %q: %w", path, st, err)
		}
	}
	r := &Result{Ranks: int(rd.int("/", "world_size"))}
	r.Hosts = rd.strs("/", "hosts")
	m := &r.Config.Model
	m.Layers, m.Vocab, m.Hidden, m.FFN = int(rd.int("/", "layers")), int(rd.int("/", "vocab")), int(rd.int("/", "hidden")), int(rd.int("/", "ffn"))
	m.SharedFFN, m.Experts, m.TopK, m.Seed = int(rd.int("/", "shared_ffn")), int(rd.int("/", "experts")), int(rd.int("/", "topk")), uint64(rd.int("/", "seed"))
	c := &r.Config
	c.Checkpoint, c.Batch, c.PrefillTokens = rd.str("/", "checkpoint"), int(rd.int("/", "batch")), int(rd.int("/", "prefill_tokens"))
	c.Overlap, c.MaskStalled = rd.int("/", "overlap") != 0, rd.int("/", "mask_stalled") != 0
	c.Timeout, c.ControlTimeout = time.Duration(rd.int("/", "timeout_us"))*time.Microsecond, time.Duration(rd.int("/", "control_timeout_us"))*time.Microsecond
	act, dtype, prefill := rd.str("/", "act"), rd.str("/", "dtype"), rd.str("/", "prefill")
	wl := &r.Workload
	wl.Requests, wl.Rate = int(rd.int("/", "requests")), rd.float("/", "rate")
	wl.PromptMin, wl.PromptMax = int(rd.int("/", "prompt_min")), int(rd.int("/", "prompt_max"))
	wl.GenMin, wl.GenMax, wl.Seed = int(rd.int("/", "gen_min")), int(rd.int("/", "gen_max")), uint64(rd.int("/", "workload_seed"))
	if rd.err != nil {
		return nil, nil, rd.err
	}
	if m.Act, err = moe.ParseActivation(act); err == nil {
		if c.DType, err = moe.ParseDType(dtype); err == nil {
			c.Prefill, err = ep.ParseMode(prefill)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("serve: %s: %w", path, err)
	}

	R := r.Ranks
	step, S := rd.int64s("steps/step", -1)
	kind, _ := rd.uint8s("steps/kind", S)
	rowsV, _ := rd.int64s("steps/rows", S*R)
	emitted, _ := rd.int64s("steps/emitted", S*R)
	dropped, _ := rd.int64s("steps/dropped_pairs", S*R)
	masked, _ := rd.int64s("steps/masked_ranks", S*R)
	start, _ := rd.float64s("steps/start_us", S*R)
	finish, _ := rd.float64s("steps/finish_us", S*R)
	if rd.err != nil {
		return nil, nil, rd.err
	}
	r.Steps = make([]Step, S)
	for i := range r.Steps {
		s := &r.Steps[i]
		s.Step, s.Kind = step[i], decodeStep.String()
		if kind[i] == 1 {
			s.Kind = prefillStep.String()
		}
		s.Rows, s.Emitted, s.Dropped, s.Masked = ints(rowsV[i*R:(i+1)*R]), ints(emitted[i*R:(i+1)*R]), ints(dropped[i*R:(i+1)*R]), ints(masked[i*R:(i+1)*R])
		s.StartUS, s.FinishUS = start[i*R:(i+1)*R], finish[i*R:(i+1)*R]
	}

	ids, N := rd.int64s("requests/id", -1)
	ranks, _ := rd.int64s("requests/rank", N)
	prompt, _ := rd.int64s("requests/prompt_tokens", N)
	genV, _ := rd.int64s("requests/gen_tokens", N)
	drop, _ := rd.int64s("requests/dropped_pairs", N)
	arr, _ := rd.float64s("requests/arrival_us", N)
	adm, _ := rd.float64s("requests/admitted_us", N)
	first, _ := rd.float64s("requests/first_token_us", N)
	done, _ := rd.float64s("requests/done_us", N)
	hash, _ := rd.uint64s("requests/logits_hash", N)
	toks, shape := rd.int32s("requests/tokens")
	if rd.err == nil && (len(shape) != 2 || shape[0] != N) {
		rd.err = fmt.Errorf("serve: %s: requests/tokens has shape %v, want [%d, gen]", path, shape, N)
	}
	if rd.err != nil {
		return nil, nil, rd.err
	}
	r.Requests = make([]Served, N)
	for i := range r.Requests {
		q := &r.Requests[i]
		*q = Served{ID: int(ids[i]), Rank: int(ranks[i]), Prompt: int(prompt[i]), Gen: int(genV[i]), DroppedPairs: int(drop[i]),
			ArrivalUS: arr[i], AdmittedUS: adm[i], FirstTokenUS: first[i], DoneUS: done[i], Hash: hash[i]}
		for _, t := range toks[i*shape[1] : (i+1)*shape[1]] {
			if t >= 0 {
				q.Tokens = append(q.Tokens, t)
			}
		}
	}

	eStep, M := rd.int64s("events/step", -1)
	eRank, _ := rd.int32sN("events/rank", M)
	eLayer, _ := rd.int32sN("events/layer", M)
	eMB, _ := rd.int32sN("events/micro_batch", M)
	ePhase, _ := rd.int32sN("events/phase", M)
	eStart, _ := rd.float64s("events/start_us", M)
	eFinish, _ := rd.float64s("events/finish_us", M)
	mRank, X := rd.int64s("masking/rank", -1)
	mAt, _ := rd.int64s("masking/masked_at_step", X)
	mBack, _ := rd.int64s("masking/rejoined_at_step", X)
	mAtUS, _ := rd.float64s("masking/masked_at_us", X)
	mBackUS, _ := rd.float64s("masking/rejoined_at_us", X)
	if rd.err != nil {
		return nil, nil, rd.err
	}
	r.Events = make([]Event, M)
	for i := range r.Events {
		r.Events[i] = Event{Step: eStep[i], Rank: int(eRank[i]), Layer: int(eLayer[i]), MB: int(eMB[i]), Phase: Phase(ePhase[i]),
			StartUS: eStart[i], FinishUS: eFinish[i]}
	}
	for i := 0; i < X; i++ {
		r.Masking = append(r.Masking, MaskEpisode{Rank: int(mRank[i]), MaskedAt: mAt[i], RejoinedAt: mBack[i], MaskedAtUS: mAtUS[i], RejoinedAtUS: mBackUS[i]})
	}
	return r, info, nil
}

func ints(v []int64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

// traceReader keeps the first error of a sequence of reads; after one,
// reads return zero values (slices of the length asked, so that callers
// may index them before checking).
type traceReader struct {
	f   *h5.File
	err error
}

// attrAs reads one attribute with get, unless an earlier read failed.
func attrAs[T any](rd *traceReader, obj, name string, get func(obj, name string) (T, error)) T {
	var v T
	if rd.err == nil {
		v, rd.err = get(obj, name)
	}
	return v
}

func (rd *traceReader) str(obj, name string) string { return attrAs(rd, obj, name, rd.f.AttrString) }
func (rd *traceReader) strs(obj, name string) []string {
	return attrAs(rd, obj, name, rd.f.AttrStrings)
}
func (rd *traceReader) int(obj, name string) int64 { return attrAs(rd, obj, name, rd.f.AttrInt64) }
func (rd *traceReader) float(obj, name string) float64 {
	return attrAs(rd, obj, name, rd.f.AttrFloat64)
}

// check notes a dataset of another length than n (n < 0: any).
func (rd *traceReader) check(name string, got, n int) {
	if rd.err == nil && n >= 0 && got != n {
		rd.err = fmt.Errorf("serve: %s: %s has %d values, want %d", rd.f.Path(), name, got, n)
	}
}

func readAs[T any](rd *traceReader, name string, n int, read func(string) ([]T, []int, error)) ([]T, int) {
	if rd.err != nil {
		return make([]T, max(n, 0)), max(n, 0)
	}
	v, _, err := read(name)
	if err != nil {
		rd.err = err
		return make([]T, max(n, 0)), max(n, 0)
	}
	rd.check(name, len(v), n)
	if rd.err != nil {
		return make([]T, max(n, 0)), max(n, 0)
	}
	return v, len(v)
}

func (rd *traceReader) int64s(name string, n int) ([]int64, int) {
	return readAs(rd, name, n, rd.f.ReadInt64)
}
func (rd *traceReader) int32sN(name string, n int) ([]int32, int) {
	return readAs(rd, name, n, rd.f.ReadInt32)
}
func (rd *traceReader) uint64s(name string, n int) ([]uint64, int) {
	return readAs(rd, name, n, rd.f.ReadUint64)
}
func (rd *traceReader) uint8s(name string, n int) ([]uint8, int) {
	return readAs(rd, name, n, rd.f.ReadUint8)
}
func (rd *traceReader) float64s(name string, n int) ([]float64, int) {
	return readAs(rd, name, n, rd.f.ReadFloat64)
}

func (rd *traceReader) int32s(name string) ([]int32, []int) {
	if rd.err != nil {
		return nil, nil
	}
	v, shape, err := rd.f.ReadInt32(name)
	rd.err = err
	return v, shape
}
