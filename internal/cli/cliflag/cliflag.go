// Package cliflag parses what the CLI's flags take and nothing else reads: --mount's
// "host:sandbox[:ro|rw]" and --env's "KEY=VALUE". Sizes are internal/size's, read by
// roched and the API too. It is a package of its own so that its tests and fuzz targets
// run without the CLI's (an engine, the agent, a test image).
package cliflag

import (
	"errors"
	"fmt"
	"strings"

	"github.com/roche-sandbox/roche"
)

// ParseMount parses the --mount syntax "host:sandbox[:ro|rw]" (read-only unless rw).
func ParseMount(s string) (roche.Mount, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return roche.Mount{}, fmt.Errorf("%w: mount %q: use HOST_PATH:SANDBOX_PATH[:ro|rw]", roche.ErrInvalidConfig, s)
	}
	m := roche.Mount{Source: parts[0], Target: parts[1]}
	if len(parts) == 3 {
		switch parts[2] {
		case "ro":
		case "rw":
			m.ReadWrite = true
		default:
			return roche.Mount{}, fmt.Errorf("%w: mount %q: mode %q is neither ro nor rw", roche.ErrInvalidConfig, s, parts[2])
		}
	}
	return m, nil
}

// ParseEnv parses "KEY=VALUE" pairs into a map.
func ParseEnv(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(pairs))
	var errs []error
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			errs = append(errs, fmt.Errorf("%w: env %q: use KEY=VALUE", roche.ErrInvalidConfig, p))
			continue
		}
		env[k] = v
	}
	return env, errors.Join(errs...)
}

// ParseMetadata reads repeated KEY=VALUE metadata flags (create --metadata, list
// --metadata); the keys and values are checked where the config is (roche.Config.Validate).
func ParseMetadata(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	md := make(map[string]string, len(pairs))
	var errs []error
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			errs = append(errs, fmt.Errorf("%w: metadata %q: use KEY=VALUE", roche.ErrInvalidConfig, p))
			continue
		}
		md[k] = v
	}
	return md, errors.Join(errs...)
}
