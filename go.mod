module github.com/stagehost/stagehost

go 1.26.8

require (
	github.com/tetratelabs/wazero v1.12.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
