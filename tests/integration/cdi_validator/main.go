// cdi-validate: the CDI reference implementation (Debian's Go module) as a
// test oracle.  `cdi-validate FILE...` reads each spec as podman does
// (strict parsing, validation) and prints its qualified device names;
// `cdi-validate -dirs D1:D2 -inject NAME...` resolves devices from spec
// directories and prints the OCI spec edits it would make, as JSON.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/container-orchestrated-devices/container-device-interface/pkg/cdi"
	oci "github.com/opencontainers/runtime-spec/specs-go"
)

func main() {
	dirs := flag.String("dirs", "", "spec directories, lowest priority first")
	inject := flag.Bool("inject", false, "resolve the names and print the OCI edits")
	flag.Parse()
	if *inject {
		reg := cdi.GetRegistry(cdi.WithSpecDirs(strings.Split(*dirs, ":")...), cdi.WithAutoRefresh(false))
		if err := reg.Refresh(); err != nil {
			fmt.Fprintln(os.Stderr, "refresh:", err)
		}
		spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		if _, err := reg.InjectDevices(spec, flag.Args()...); err != nil {
			fmt.Fprintln(os.Stderr, "inject:", err)
			os.Exit(1)
		}
		out, _ := json.Marshal(spec)
		fmt.Println(string(out))
		return
	}
	rc := 0
	for _, path := range flag.Args() {
		spec, err := cdi.ReadSpec(path, 0)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			rc = 1
			continue
		}
		for _, d := range spec.Devices {
			fmt.Printf("%s=%s\n", spec.Kind, d.Name)
		}
	}
	os.Exit(rc)
}
