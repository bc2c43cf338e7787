module github.com/goep/goep

go 1.24.0

require (
	github.com/emer/empi/v2 v2.0.0-dev0.0.5
	github.com/stretchr/testify v1.12.1
	gonum.org/v1/gonum v0.17.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
