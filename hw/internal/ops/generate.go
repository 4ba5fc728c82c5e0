package ops

//go:generate go run ./gencopy
