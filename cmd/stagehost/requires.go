package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

const requiresUsage = `Usage:
  stagehost requires set MODULE.wasm REQUIRES.toml -o OUT.wasm
      write the module's declared requirements (abi/ABI.md §7): the TOML
      file as the JSON of a "stagehost.requires" custom section, which
      replaces any the module has; OUT may be MODULE itself
  stagehost requires show MODULE.wasm
      print the module's requirements as JSON ("none" without the section)
`

// maxRequiresTOML bounds a requirements TOML file.
const maxRequiresTOML = 1 << 20

func cmdRequires(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, requiresUsage)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, requiresUsage)
		return exitOK
	case "set":
		return requiresSet(args[1:], stdout, stderr)
	case "show":
		if len(args) != 2 || strings.HasPrefix(args[1], "-") {
			fmt.Fprintf(stderr, "stagehost requires show: want one MODULE.wasm argument\n\n%s", requiresUsage)
			return exitUsage
		}
		bin, err := manifest.ReadFile(args[1], stages.DefaultMaxModuleSize)
		if err != nil {
			fmt.Fprintf(stderr, "stagehost requires show: %v\n", err)
			return exitInvalid
		}
		r, err := stages.ReadRequires(bin)
		if err != nil {
			fmt.Fprintf(stderr, "stagehost requires show: %s: %v\n", args[1], err)
			return exitInvalid
		}
		if r == nil {
			fmt.Fprintf(stdout, "none: %s has no %s section (it is accepted as every module was before requirements)\n", args[1], abi.RequiresSection)
			return exitOK
		}
		var out bytes.Buffer
		_ = json.Indent(&out, r.Marshal(), "", "  ")
		fmt.Fprintln(stdout, out.String())
		return exitOK
	}
	fmt.Fprintf(stderr, "stagehost requires: unknown subcommand %q\n\n%s", args[0], requiresUsage)
	return exitUsage
}

func requiresSet(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("requires set", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("o", "", "the module to write")
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			fmt.Fprintf(stderr, "stagehost requires set: %v\n\n%s", err, requiresUsage)
			return exitUsage
		}
		if args = fs.Args(); len(args) > 0 {
			pos, args = append(pos, args[0]), args[1:]
		}
	}
	if len(pos) != 2 || *out == "" {
		fmt.Fprintf(stderr, "stagehost requires set: want MODULE.wasm REQUIRES.toml -o OUT.wasm\n\n%s", requiresUsage)
		return exitUsage
	}
	bin, err := manifest.ReadFile(pos[0], stages.DefaultMaxModuleSize)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost requires set: %v\n", err)
		return exitInvalid
	}
	src, err := manifest.ReadFile(pos[1], maxRequiresTOML)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost requires set: %v\n", err)
		return exitInvalid
	}
	r, err := requiresFromTOML(src)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost requires set: %s: %v\n", pos[1], err)
		return exitInvalid
	}
	res, err := stages.SetRequires(bin, r)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost requires set: %s: %v\n", pos[0], err)
		return exitInvalid
	}
	if err := os.WriteFile(*out, res, 0o644); err != nil {
		fmt.Fprintf(stderr, "stagehost requires set: %v\n", err)
		return exitInvalid
	}
	fmt.Fprintf(stdout, "%s: %d bytes, sha256 %s (pin this one in the manifest)\n", *out, len(res), stages.SHA256(res))
	return exitOK
}

// requiresFromTOML reads a requirements document written in TOML: the
// keys of the JSON document, [[inputs]] and [[outputs]] as tables;
// "version" may be left out (it is 1). The document is then checked as
// the host reads it ([abi.ParseRequires]), so an error names the key.
func requiresFromTOML(src []byte) (*abi.Requires, error) {
	var doc map[string]any
	if _, err := toml.Decode(string(src), &doc); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("line %d: %s", pe.Position.Line, pe.Message)
		}
		return nil, err
	}
	if _, ok := doc["version"]; !ok {
		doc["version"] = abi.RequiresVersion
	}
	js, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	return abi.ParseRequires(js)
}
