package study

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/goep/goep/internal/h5"
)

// Row compares the model with one measurement.
type Row struct {
	Rec                 *Record
	Phase               string
	Measured, Predicted float64 // microseconds
	RelErr              float64 // (predicted - measured) / measured
	Held                bool    // left out of the fit
}

// Validate predicts every record of recs (both phases) with m. held marks
// the records that were left out of m's fit (nil: none).
func Validate(m *Model, recs []Record, held func(*Record) bool) ([]Row, error) {
	var rows []Row
	for i := range recs {
		r := &recs[i]
		for _, phase := range Phases {
			pred, err := m.Time(r, phase)
			if err != nil {
				return nil, err
			}
			meas := r.DispatchUS
			if phase == "combine" {
				meas = r.CombineUS
			}
			rows = append(rows, Row{Rec: r, Phase: phase, Measured: meas, Predicted: pred,
				RelErr: (pred - meas) / meas, Held: held != nil && held(r)})
		}
	}
	return rows, nil
}

// ErrStats summarises relative errors.
type ErrStats struct {
	N                 int
	MedianAbs, MaxAbs float64 // of |relative error|
}

// Stats summarises the rows that keep accepts (nil: all).
func Stats(rows []Row, keep func(*Row) bool) ErrStats {
	var v []float64
	for i := range rows {
		if keep == nil || keep(&rows[i]) {
			v = append(v, math.Abs(rows[i].RelErr))
		}
	}
	if len(v) == 0 {
		return ErrStats{}
	}
	slices.Sort(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return ErrStats{N: len(v), MedianAbs: med, MaxAbs: v[len(v)-1]}
}

// WriteModel stores m in the study file at path, as attributes of the
// groups /model/<mode>/<phase> (alpha_us, per_peer_us, shm_gbps,
// net_alpha_us, net_per_peer_us, net_gbps, over_alpha_us, over_gbps,
// has_net, fit_runs, fit_runs_net) and of /model (cpus, shared_host, and
// extra).
func WriteModel(path string, m *Model, extra map[string]any) (err error) {
	f, err := h5.OpenRW(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	if err := checkFormat(f); err != nil {
		return err
	}
	shared := 0
	if m.SharedHost {
		shared = 1
	}
	attrs := map[string]any{"cpus": m.CPUs, "shared_host": shared,
		"description": "t = f*(alpha + per_peer*(R-1) + B/shm + [N>1]*(net_alpha + net_per_peer*(R-P) + X/net)) + (f-1)*(over_alpha + B/over); see docs/scaling.md"}
	for k, v := range extra {
		attrs[k] = v
	}
	for _, k := range sortedKeys(attrs) {
		if err := f.SetAttr("model", k, attrs[k]); err != nil {
			return err
		}
	}
	for _, key := range sortedKeys(m.Params) {
		p := m.Params[key]
		has := 0
		if p.HasNet {
			has = 1
		}
		vals := map[string]any{"alpha_us": p.Alpha, "per_peer_us": p.PerPeer, "shm_gbps": p.ShmGBps,
			"net_alpha_us": p.NetAlpha, "net_per_peer_us": p.NetPerPeer, "net_gbps": p.NetGBps,
			"over_alpha_us": p.OverAlpha, "over_gbps": p.OverGBps,
			"has_net": has, "fit_runs": p.FitRuns, "fit_runs_net": p.FitRunsNet}
		for _, k := range sortedKeys(vals) {
			if err := f.SetAttr("model/"+key, k, vals[k]); err != nil {
				return err
			}
		}
	}
	return f.Flush()
}

// ReadModel reads a model stored by WriteModel.
func ReadModel(path string) (*Model, error) {
	f, err := h5.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if !f.Exists("model") {
		return nil, fmt.Errorf("study: %s has no /model: run ep-plot model -write", path)
	}
	m := &Model{Params: map[string]Params{}}
	cpus, err := f.AttrInt64("model", "cpus")
	if err != nil {
		return nil, err
	}
	shared, err := f.AttrInt64("model", "shared_host")
	if err != nil {
		return nil, err
	}
	m.CPUs, m.SharedHost = int(cpus), shared != 0
	modes, err := f.List("model")
	if err != nil {
		return nil, err
	}
	for _, mode := range modes {
		for _, phase := range Phases {
			obj := "model/" + Key(mode, phase)
			if !f.Exists(obj) {
				continue
			}
			var p Params
			var errs []error
			get := func(name string) float64 {
				v, err := f.AttrFloat64(obj, name)
				errs = append(errs, err)
				return v
			}
			geti := func(name string) int {
				v, err := f.AttrInt64(obj, name)
				errs = append(errs, err)
				return int(v)
			}
			p.Alpha, p.PerPeer, p.ShmGBps = get("alpha_us"), get("per_peer_us"), get("shm_gbps")
			p.NetAlpha, p.NetPerPeer, p.NetGBps = get("net_alpha_us"), get("net_per_peer_us"), get("net_gbps")
			p.OverAlpha, p.OverGBps = get("over_alpha_us"), get("over_gbps")
			p.HasNet, p.FitRuns, p.FitRunsNet = geti("has_net") != 0, geti("fit_runs"), geti("fit_runs_net")
			if err := errors.Join(errs...); err != nil {
				return nil, err
			}
			m.Params[Key(mode, phase)] = p
		}
	}
	return m, nil
}
