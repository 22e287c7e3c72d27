// Package size is the one grammar of byte counts written as text in Roche: the memory,
// disk and workspace sizes of a sandbox (the CLI's --memory, --disk, --workspace-size;
// roche.Config's Memory, Disk and WorkspaceSize, over the API and in pool specs), a
// copy's cap (roche cp --max-bytes, roched's --copy-max-bytes and its config file's
// copy_max_bytes), and every size printed in a message. Parse reads it; String prints a
// count in it, so what Roche prints, a user can give back.
//
// A size is a decimal number, with an optional fraction, and an optional unit, with or
// without a space between: "512m", "1.5g", "64 MiB", "4096", "4096 bytes". Units are
// binary (k is 1024) and case-insensitive, with an optional "b" or "ib" ("512MiB",
// "512mb" and "512m" are the same): b or byte(s), k, m, g, t, p. A fraction of a byte
// is dropped.
package size

import (
	"fmt"
	"math/big"
	"strings"
)

// units are the binary units, each 1024 times the one before it, from the byte.
var units = []struct{ short, long string }{{"", "bytes"}, {"k", "KiB"}, {"m", "MiB"}, {"g", "GiB"}, {"t", "TiB"}, {"p", "PiB"}}

// Parse reads a size, 0 or more bytes. The error names s and says how to write one;
// callers check their own bounds.
func Parse(s string) (int64, error) {
	if len(s) > maxText {
		return 0, fmt.Errorf("a size of %d characters is not a size: give a number with an optional unit, e.g. 512m", len(s))
	}
	num, unit := split(strings.TrimSpace(s))
	shift, ok := unitShift(unit)
	if !ok || !decimal(num) {
		if ok && strings.HasPrefix(num, "-") && decimal(num[1:]) {
			return 0, fmt.Errorf("%q is negative: give 0 or more, e.g. 512m", s)
		}
		return 0, fmt.Errorf("%q is not a size: give a number with an optional unit k, m, g or t, e.g. 512m or 1.5g", s)
	}
	r, _ := new(big.Rat).SetString(num) // decimal(num) makes it parse
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), shift)))
	n := new(big.Int).Quo(r.Num(), r.Denom()) // both positive: rounds down
	switch {
	case !n.IsInt64():
		return 0, fmt.Errorf("%q is too large", s)
	case n.Sign() == 0 && r.Sign() != 0:
		// Dropping the fraction must not make a size 0, which means "no limit" to a disk.
		return 0, fmt.Errorf("%q is less than a byte: give whole bytes, or 0", s)
	}
	return n.Int64(), nil
}

// maxText bounds the text Parse reads: no size needs more, and a number of a million
// digits (from an API caller) is not worth converting.
const maxText = 64

// split cuts s into its number and its unit, the spaces between them dropped.
func split(s string) (num, unit string) {
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' && r != '-' })
	if i < 0 {
		return s, ""
	}
	return s[:i], strings.TrimLeft(s[i:], " \t")
}

// decimal reports whether s is digits with, optionally, a point and more digits.
func decimal(s string) bool {
	whole, frac, point := strings.Cut(s, ".")
	digits := func(d string) bool {
		return d != "" && strings.Trim(d, "0123456789") == ""
	}
	return digits(whole) && (!point || digits(frac))
}

// unitShift is the power of two unit stands for.
func unitShift(unit string) (uint, bool) {
	u := strings.ToLower(unit)
	switch u {
	case "", "b", "byte", "bytes":
		return 0, true
	}
	u = strings.TrimSuffix(strings.TrimSuffix(u, "b"), "i")
	for i, un := range units[1:] {
		if u == un.short {
			return uint(10 * (i + 1)), true
		}
	}
	return 0, false
}

// String prints n (0 or more) for people, in the largest unit that holds it exactly
// with at most two decimals, else in bytes: "64 MiB", "1.5 GiB", "4097 bytes". Parse
// reads it back to n.
func String(n int64) string {
	if n < 0 {
		return fmt.Sprintf("%d bytes", n)
	}
	for i := len(units) - 1; i > 0; i-- {
		u := int64(1) << (10 * i)
		if n < u || n%u*100%u != 0 {
			continue
		}
		whole, hundredths := n/u, n%u*100/u
		switch {
		case hundredths == 0:
			return fmt.Sprintf("%d %s", whole, units[i].long)
		case hundredths%10 == 0:
			return fmt.Sprintf("%d.%d %s", whole, hundredths/10, units[i].long)
		default:
			return fmt.Sprintf("%d.%02d %s", whole, hundredths, units[i].long)
		}
	}
	if n == 1 {
		return "1 byte"
	}
	return fmt.Sprintf("%d bytes", n)
}
