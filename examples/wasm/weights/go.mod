module github.com/stagehost/stagehost/examples/wasm/weights

go 1.26

require github.com/stagehost/stagehost/guest-sdk v0.0.0

replace github.com/stagehost/stagehost/guest-sdk => ../../../guest-sdk
