//go:build !linux

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "roche-pause runs only in a Linux Pod sandbox")
	os.Exit(1)
}
