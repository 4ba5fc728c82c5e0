module github.com/stagehost/stagehost/examples/wasm/digits/stage

go 1.26.8

require (
	github.com/stagehost/stagehost v0.0.0
	github.com/stagehost/stagehost/guest-sdk v0.0.0
)

replace (
	github.com/stagehost/stagehost => ../../../..
	github.com/stagehost/stagehost/guest-sdk => ../../../../guest-sdk
)
