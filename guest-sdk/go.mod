module github.com/stagehost/stagehost/guest-sdk

go 1.26
