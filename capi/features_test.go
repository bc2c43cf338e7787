//go:build mpi

package main

import (
	"encoding/binary"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/goep/goep/ep"
)

// goFeatureNames reads the names of ep.Feature's constants from their
// declaration (ep/driver/feature.go), by value: the first is iota + 1, the
// others follow it.
func goFeatureNames(t *testing.T) map[ep.Feature]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../ep/driver/feature.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	names := map[ep.Feature]string{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for i, s := range gd.Specs {
			vs := s.(*ast.ValueSpec)
			if i == 0 {
				id, ok := vs.Type.(*ast.Ident)
				if !ok || id.Name != "Feature" {
					break
				}
				be, ok := vs.Values[0].(*ast.BinaryExpr)
				if !ok || be.Op != token.ADD || be.X.(*ast.Ident).Name != "iota" || be.Y.(*ast.BasicLit).Value != "1" {
					t.Fatalf("the first Feature is no longer iota + 1: update this test's reading of feature.go")
				}
			} else if len(vs.Values) != 0 {
				t.Fatalf("Feature %s has a value of its own: update this test's reading of feature.go", vs.Names[0].Name)
			}
			if ast.IsExported(vs.Names[0].Name) { // not featureEnd, one past the last
				names[ep.Feature(i+1)] = vs.Names[0].Name
			}
		}
	}
	return names
}

// TestFeatureEnum checks goep_ep.h's goepEpFeature_t against ep.Feature:
// every Feature has an enum value of the same number and name
// (FeatureFP8Wire is GOEP_EP_FEATURE_FP8_WIRE), and the enum has no other.
func TestFeatureEnum(t *testing.T) {
	goNames := goFeatureNames(t)
	hdr, err := os.ReadFile("goep_ep.h")
	if err != nil {
		t.Fatal(err)
	}
	enum := map[string]int{}
	for _, m := range regexp.MustCompile(`\b(GOEP_EP_FEATURE_\w+)\s*=\s*(\d+)`).FindAllStringSubmatch(string(hdr), -1) {
		n, _ := strconv.Atoi(m[2])
		enum[m[1]] = n
	}
	squash := func(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "_", "")) }
	all := ep.Features()
	if len(all) != len(goNames) || len(all) != len(features) || len(all) != len(enum) {
		t.Fatalf("ep.Features() has %d, feature.go declares %d, capi's table %d, goep_ep.h's enum %d",
			len(all), len(goNames), len(features), len(enum))
	}
	for _, f := range all {
		goName := goNames[f]
		cName := "GOEP_EP_FEATURE_" + strings.TrimPrefix(goName, "Feature")
		found := false
		for _, e := range features {
			if e.f != f {
				continue
			}
			found = true
			if e.goName != goName {
				t.Errorf("ep.Feature %d is %s in feature.go, %s in capi's table", int(f), goName, e.goName)
			}
			if squash(e.cName) != squash(cName) {
				t.Errorf("ep.%s: capi's table names it %s", goName, e.cName)
			}
			if int(e.c) != int(f) {
				t.Errorf("ep.%s = %d: %s = %d", goName, int(f), e.cName, int(e.c))
			}
			if v, ok := enum[e.cName]; !ok || v != int(f) {
				t.Errorf("ep.%s = %d: goep_ep.h has %s = %d (declared: %v)", goName, int(f), e.cName, v, ok)
			}
		}
		if !found {
			t.Errorf("ep.%s (%d) has no goepEpFeature_t", goName, int(f))
		}
	}
}

// TestBackendSupportsCPU checks goepEpBackendSupports against ep.Supports on
// the CPU engine, feature by feature.
func TestBackendSupportsCPU(t *testing.T) {
	for _, e := range features {
		got, err := backendSupports("cpu", e.c)
		if err != nil {
			t.Fatal(err)
		}
		if want := ep.Supports(ep.CPU, e.f); got != want {
			t.Errorf("goepEpBackendSupports(\"cpu\", %s) = %v, ep.Supports(ep.CPU, ep.%s) = %v", e.cName, got, e.goName, want)
		}
	}
	if _, err := backendSupports("no-such-backend", features[0].c); err == nil || !strings.Contains(err.Error(), `"no-such-backend"`) {
		t.Errorf("an unknown backend: %v, want an error naming it", err)
	}
}

// partialBackend declares only the features in has: what the C layer asks
// a backend for is then refused by name.
type partialBackend struct {
	ep.Backend
	has []ep.Feature
}

func (b partialBackend) Name() string { return "partial" }
func (b partialBackend) Supports(f ep.Feature) bool {
	return slices.Contains(b.has, f)
}

// TestNeedNamesBackendAndFeature checks that a setting asking for a feature
// the group's backend does not declare is refused naming both, and that one
// it declares passes: the C layer's offers follow the backend's declarations.
func TestNeedNamesBackendAndFeature(t *testing.T) {
	gc := groupConfig{be: partialBackend{has: []ep.Feature{ep.FeatureFP8Wire}}, backend: "partial"}
	if err := gc.need(ep.FeatureFP8Wire, "options.dispatch_quant"); err != nil {
		t.Errorf("a declared feature: %v", err)
	}
	for _, f := range []ep.Feature{ep.FeatureFP8Forward, ep.FeatureFP8Combine, ep.FeatureHTExpertMajor, ep.FeatureLLRankMajor,
		ep.FeatureOverflowDrop, ep.FeatureMaskStalledRanks, ep.FeatureNVFP4Forward, ep.FeatureNVFP4Combine} {
		err := gc.need(f, "the setting")
		if err == nil || !strings.Contains(err.Error(), `backend "partial"`) || !strings.Contains(err.Error(), f.String()) ||
			!strings.Contains(err.Error(), "the setting") {
			t.Errorf("need(%v) = %v, want an error naming the setting, the feature and the backend", f, err)
		}
	}
}

// optionsWith is a version-2 goepEpGroupOptions_t (backend NULL) with its
// combine_quant (bytes 12-15) and dispatch_quant (bytes 24-27) set.
func optionsWith(combineQuant, dispatchQuant uint32) *descStruct {
	raw := make([]byte, 32)
	binary.LittleEndian.PutUint32(raw[12:], combineQuant)
	binary.LittleEndian.PutUint32(raw[24:], dispatchQuant)
	return newDescStruct(descGroupOptions, raw, true)
}

// TestQuantOptionsFollowBackend checks the recipes a group's options name
// against its backend: each is offered where the backend declares the
// feature the format table gives for it, and refused naming the option, the
// feature and the backend where it does not. NVFP4 forwarding is its own
// dispatch_quant value, so a group asks for it before any tokens exist.
func TestQuantOptionsFollowBackend(t *testing.T) {
	cases := []struct {
		name           string
		combine, disp  uint32
		mode           ep.Mode
		feature        ep.Feature
		setting        string
		wire, combWire ep.WireFormat
	}{
		{"NVFP4 forward", 0, 0x100, ep.LowLatency, ep.FeatureNVFP4Forward, "options.dispatch_quant = GOEP_EP_DISP_QUANT_FWD_NVFP4",
			ep.WireNVFP4Forward, ep.WireNative},
		{"NVFP4 forward, HT", 0, 0x100, ep.HighThroughput, ep.FeatureNVFP4Forward, "GOEP_EP_DISP_QUANT_FWD_NVFP4",
			ep.WireNVFP4Forward, ep.WireNative},
		{"FP8 forward", 0, 1, ep.LowLatency, ep.FeatureFP8Forward, "options.dispatch_quant = GOEP_EP_DISP_QUANT_FWD",
			ep.WireFP8Forward, ep.WireNative},
		{"FP8 dispatch", 0, 2, ep.HighThroughput, ep.FeatureFP8Wire, "GOEP_EP_DISP_QUANT_DS_FP8E3M4", ep.WireFP8, ep.WireNative},
		{"NVFP4 combine", 1, 0, ep.LowLatency, ep.FeatureNVFP4Combine, "options.combine_quant = GOEP_EP_COMB_QUANT_NVFP4",
			ep.WireNative, ep.WireNVFP4},
		{"FP8 combine", 0x100, 0, ep.HighThroughput, ep.FeatureFP8Combine, "GOEP_EP_COMB_QUANT_FP8", ep.WireNative, ep.WireFP8},
	}
	for _, c := range cases {
		d := optionsWith(c.combine, c.disp)
		lacking := groupConfig{be: partialBackend{}, backend: "partial", cfg: ep.Config{Mode: c.mode}}
		err := d.readQuant(&lacking)
		if err == nil || resultOf(err) != 5 || !strings.Contains(err.Error(), c.setting) || !strings.Contains(err.Error(), c.feature.String()) ||
			!strings.Contains(err.Error(), `backend "partial"`) {
			t.Errorf("%s on a backend without %v: %v, want goepEpInvalidUsage naming %q, the feature and the backend", c.name, c.feature, err, c.setting)
		}
		having := groupConfig{be: partialBackend{has: []ep.Feature{c.feature}}, backend: "partial", cfg: ep.Config{Mode: c.mode}}
		if err := d.readQuant(&having); err != nil {
			t.Errorf("%s on a backend with %v: %v", c.name, c.feature, err)
		} else if having.cfg.Wire != c.wire || having.cfg.CombineWire != c.combWire {
			t.Errorf("%s: Wire %v, CombineWire %v; want %v, %v", c.name, having.cfg.Wire, having.cfg.CombineWire, c.wire, c.combWire)
		}
		d.free()
	}
	// The NVFP4 combine is LowLatency's: in an HT group no feature is asked,
	// and the config's own check refuses the format by name.
	d := optionsWith(1, 0)
	defer d.free()
	ht := groupConfig{be: partialBackend{}, backend: "partial", cfg: ep.Config{Mode: ep.HighThroughput}}
	if err := d.readQuant(&ht); err != nil || ht.cfg.CombineWire != ep.WireNVFP4 {
		t.Fatalf("NVFP4 combine option in HT: %v, CombineWire %v", err, ht.cfg.CombineWire)
	}
	ht.cfg.NumExperts, ht.cfg.MaxTokensPerRank, ht.cfg.Hidden, ht.cfg.TopK = 4, 8, 64, 2
	if err := ht.cfg.Validate(2); err == nil || !strings.Contains(err.Error(), "CombineWire nvfp4 is not a combine format of HighThroughput groups") {
		t.Errorf("an HT group with the NVFP4 combine: %v, want it refused naming the format and the mode", err)
	}
}
