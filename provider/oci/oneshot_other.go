//go:build !linux

package oci

import (
	"errors"
	"net"
	"os"
)

func socketPair() (net.Conn, *os.File, error) {
	return nil, nil, errors.New("one-shot sandboxes run on Linux only")
}
