module github.com/tidal-serving/tidal/tests/charts/dashboardcheck

go 1.26

require github.com/grafana/grafana-foundation-sdk/go v0.0.22
