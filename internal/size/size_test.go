package size

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := map[string]int64{
		"0": 0, "4096": 4096, "2k": 2 << 10, "512m": 512 << 20, "1g": 1 << 30, "1G": 1 << 30, "10t": 10 << 40, "1p": 1 << 50,
		"1.5g": 3 << 29, "1.5GiB": 3 << 29, "0.5k": 512, "65536k": 64 << 20, "512MiB": 512 << 20, "512mb": 512 << 20,
		" 2g ": 2 << 30, "64 MiB": 64 << 20, "4097 bytes": 4097, "1 byte": 1, "17b": 17, "1.3g": 1395864371,
		"1.25 MiB": 5 << 18, "9223372036854775807": 1<<63 - 1,
	}
	for in, want := range good {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	bad := map[string]string{
		"": "not a size", "lots": "not a size", "512x": "not a size", "m": "not a size", "g": "not a size",
		"NaN": "not a size", "inf": "not a size", "1e9": "not a size", "0x10": "not a size", "1.": "not a size",
		".5g": "not a size", "1ib": "not a size", "1 2": "not a size", "1,5g": "not a size", "1_000": "not a size",
		"-1g": "negative", "-0.5m": "negative", " -100m": "negative",
		"9223372036854775808": "too large", "8192p": "too large",
		"0.1": "less than a byte", "0.5b": "less than a byte",
		strings.Repeat("1", 65): "65 characters",
	}
	for in, want := range bad {
		if n, err := Parse(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %d, %v; want an error saying %q", in, n, err, want)
		}
	}
}

func TestString(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 bytes", 1: "1 byte", 4097: "4097 bytes", 4096: "4 KiB", 128 << 10: "128 KiB", 64 << 20: "64 MiB",
		1 << 30: "1 GiB", 3 << 29: "1.5 GiB", 5 << 18: "1.25 MiB", 10 << 40: "10 TiB", 1536: "1.5 KiB", 1030: "1030 bytes",
		1<<63 - 1: "9223372036854775807 bytes", 1 << 62: "4096 PiB",
	} {
		if got := String(n); got != want {
			t.Errorf("String(%d) = %q, want %q", n, got, want)
		}
	}
}
