package study

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Want is what a study is expected to hold (zero fields ask nothing).
type Want struct {
	MinRows int
	Modes   []string // each must occur
	DTypes  []string // each must occur
	Nodes   []int    // each node count must occur (2: some run really spanned 2 nodes)
	Ranks   []int    // each rank count must occur
	Attrs   []string // root attributes that must be present and not empty
}

// Check reports, as one error naming every problem, what s lacks of w, and
// any record whose figures are not finite and positive where they must be.
func (s *Study) Check(w Want) error {
	var errs []error
	if len(s.Records) < w.MinRows {
		errs = append(errs, fmt.Errorf("%d rows, want at least %d", len(s.Records), w.MinRows))
	}
	has := func(f func(*Record) bool) bool {
		return slices.ContainsFunc(s.Records, func(r Record) bool { return f(&r) })
	}
	for _, m := range w.Modes {
		if !has(func(r *Record) bool { return r.Mode == m }) {
			errs = append(errs, fmt.Errorf("no %s rows", m))
		}
	}
	for _, d := range w.DTypes {
		if !has(func(r *Record) bool { return r.DType == d }) {
			errs = append(errs, fmt.Errorf("no %s rows", d))
		}
	}
	for _, n := range w.Nodes {
		if !has(func(r *Record) bool { return r.Nodes == n }) {
			errs = append(errs, fmt.Errorf("no row measured on %d node(s) (nodes seen: %v)", n, s.values(func(r *Record) int { return r.Nodes })))
		}
	}
	for _, n := range w.Ranks {
		if !has(func(r *Record) bool { return r.Ranks == n }) {
			errs = append(errs, fmt.Errorf("no row measured on %d rank(s) (ranks seen: %v)", n, s.values(func(r *Record) int { return r.Ranks })))
		}
	}
	for _, a := range w.Attrs {
		if s.AttrString(a) == "" {
			errs = append(errs, fmt.Errorf("root attribute %s missing or empty", a))
		}
	}
	for i := range s.Records {
		r := &s.Records[i]
		if err := r.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("row %d: %w", i, err))
		}
		if !(r.BytesPerRank >= 0) || !(r.MemcpyGBps > 0) {
			errs = append(errs, fmt.Errorf("row %d: bytes_per_rank %g, memcpy_gbps %g", i, r.BytesPerRank, r.MemcpyGBps))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("study: %s: %w", s.Path, errors.Join(errs...))
	}
	return nil
}

func (s *Study) values(f func(*Record) int) []int {
	var v []int
	for i := range s.Records {
		if x := f(&s.Records[i]); !slices.Contains(v, x) {
			v = append(v, x)
		}
	}
	slices.Sort(v)
	return v
}

// Summary writes a few lines about s: its job, steps, rows and what they span.
func (s *Study) Summary(w io.Writer) {
	fmt.Fprintf(w, "%s: %s version %s, created %s on %s (%s CPUs)\n", s.Path, s.AttrString("format"),
		s.AttrString("version"), s.AttrString("created"), s.AttrString("host"), s.AttrString("host_cpus"))
	if id := s.AttrString("slurm_job_id"); id != "" {
		fmt.Fprintf(w, "  Slurm job %s on %s (%s nodes), launcher %s\n", id, s.AttrString("slurm_job_nodelist"),
			s.AttrString("slurm_job_num_nodes"), s.AttrString("launcher"))
	}
	fmt.Fprintf(w, "  %d rows from %d job steps\n", len(s.Records), len(s.Steps))
	var layouts []string
	for i := range s.Records {
		r := &s.Records[i]
		l := fmt.Sprintf("%dx%d", r.Nodes, r.Ranks)
		if !slices.Contains(layouts, l) {
			layouts = append(layouts, l)
		}
	}
	slices.Sort(layouts)
	str := func(f func(*Record) string) string {
		var v []string
		for i := range s.Records {
			if x := f(&s.Records[i]); !slices.Contains(v, x) {
				v = append(v, x)
			}
		}
		return strings.Join(v, ",")
	}
	fmt.Fprintf(w, "  modes %s; dtypes %s; nodes x ranks %s; tokens %v; hidden %v; topk %v; experts %v\n",
		str(func(r *Record) string { return r.Mode }), str(func(r *Record) string { return r.DType }),
		strings.Join(layouts, " "), s.values(func(r *Record) int { return r.Tokens }),
		s.values(func(r *Record) int { return r.Hidden }), s.values(func(r *Record) int { return r.TopK }),
		s.values(func(r *Record) int { return r.Experts }))
}
