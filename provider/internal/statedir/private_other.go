//go:build !unix

package statedir

import "errors"

var errNoPrivateFiles = errors.New("private cache files need a unix system")

// ReadPrivate refuses: without file owners and modes nothing shows who wrote a file.
func ReadPrivate(string, int64) ([]byte, error) { return nil, errNoPrivateFiles }

// WritePrivate writes nothing, for ReadPrivate would not read it.
func WritePrivate(string, ...[]byte) error { return errNoPrivateFiles }

// MapPrivate refuses, as ReadPrivate does.
func MapPrivate(string, int64) ([]byte, *Mapping, error) { return nil, nil, errNoPrivateFiles }

// Mapping is what MapPrivate mapped: never anything here.
type Mapping struct{}

// Keep does nothing: nothing is mapped.
func (*Mapping) Keep([]byte) {}

// Unmap does nothing: nothing is mapped.
func (*Mapping) Unmap() {}
