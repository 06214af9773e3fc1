// Command dashboardcheck validates Grafana dashboard JSON with the Grafana Foundation SDK's
// strict decoders, generated from Grafana's own dashboard schema: a field the schema does not
// have, a value of the wrong type or a missing required field is an error, and so is a panel
// type or datasource whose schema is not registered here (they would be decoded laxly).
//
//	dashboardcheck --schema-version     prints the dashboard schemaVersion the SDK implements
//	dashboardcheck FILE...              exits 1 with one line per problem
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/text"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

func register() map[string]bool {
	runtime := cog.NewRuntime()
	panels := map[string]bool{"row": true}
	for _, variant := range []struct {
		id  string
		reg func()
	}{
		{"timeseries", func() { runtime.RegisterPanelcfgVariant(timeseries.VariantConfig()) }},
		{"stat", func() { runtime.RegisterPanelcfgVariant(stat.VariantConfig()) }},
		{"table", func() { runtime.RegisterPanelcfgVariant(table.VariantConfig()) }},
		{"state-timeline", func() { runtime.RegisterPanelcfgVariant(statetimeline.VariantConfig()) }},
		{"text", func() { runtime.RegisterPanelcfgVariant(text.VariantConfig()) }},
	} {
		variant.reg()
		panels[variant.id] = true
	}
	runtime.RegisterDataqueryVariant(prometheus.VariantConfig())
	return panels
}

type loosePanel struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
	} `json:"datasource"`
	Targets []struct {
		Datasource *struct {
			Type string `json:"type"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []loosePanel `json:"panels"`
}

// coverage reports panels and queries the strict decoders would only have decoded laxly.
func coverage(raw []byte, known map[string]bool) []string {
	var doc struct {
		Panels []loosePanel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return []string{err.Error()}
	}
	var problems []string
	var walk func([]loosePanel)
	walk = func(panels []loosePanel) {
		for _, p := range panels {
			if !known[p.Type] {
				problems = append(problems, fmt.Sprintf("panel %q: type %q has no schema registered in dashboardcheck", p.Title, p.Type))
			}
			for i, t := range p.Targets {
				ds := t.Datasource
				if ds == nil {
					ds = p.Datasource
				}
				if ds == nil || ds.Type != "prometheus" {
					problems = append(problems, fmt.Sprintf("panel %q: target %d has no prometheus datasource type", p.Title, i))
				}
			}
			walk(p.Panels)
		}
	}
	walk(doc.Panels)
	return problems
}

// messages splits the SDK's joined errors, dropping the empty ones some nested decoders return
// (an empty error list typed as a non-nil error).
func messages(err error) []string {
	var out []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if strings.TrimSpace(line) != "" {
			out = append(out, line)
		}
	}
	return out
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--schema-version" {
		fmt.Println(dashboard.NewDashboard().SchemaVersion)
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboardcheck --schema-version | FILE...")
		os.Exit(2)
	}
	known := register()
	failed := false
	for _, path := range os.Args[1:] {
		raw, err := os.ReadFile(path)
		if err != nil {
			fmt.Printf("%s: %v\n", path, err)
			failed = true
			continue
		}
		var board dashboard.Dashboard
		problems := coverage(raw, known)
		if err := board.UnmarshalJSONStrict(raw); err != nil {
			problems = append(problems, messages(err)...)
		}
		if err := board.Validate(); err != nil {
			problems = append(problems, messages(err)...)
		}
		for _, p := range problems {
			fmt.Printf("%s: %s\n", path, p)
			failed = true
		}
		if len(problems) == 0 {
			fmt.Printf("%s: ok (schemaVersion %d, %d panels)\n", path, board.SchemaVersion, len(board.Panels))
		}
	}
	if failed {
		os.Exit(1)
	}
}
