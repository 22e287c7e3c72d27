//go:build !cgo

package server_test

const cgoEnabled = false
