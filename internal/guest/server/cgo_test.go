//go:build cgo

package server_test

// The agent is a static binary built with CGO_ENABLED=0 (it runs in images without a C
// library); with cgo the tests would test another program: another runtime start, and
// threads the C library makes.
const cgoEnabled = true
