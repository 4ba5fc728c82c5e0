module github.com/stagehost/stagehost

go 1.26.8

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/tetratelabs/wazero v1.12.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
