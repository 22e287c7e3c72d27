package escape

import (
	"fmt"
	"slices"
	"strings"
)

// An escape case: the attempts it makes (keys of the observations the probe and the
// host-side steps record) and, per column, what stops each and why.
type escapeCase struct {
	id    string
	title string // what is attempted, for the table's legend
	keys  []string
	// guards says, per column ("*" for every column not named), which answers mean the
	// attempt was stopped and by what. An answer no guard names fails the run: the
	// reason it is stopped changed, or it was never tried.
	guards map[string][]guard
	// na says, per column, why the case has no surface there; its attempts must then
	// have answered "nosurface: ..." (or been stopped all the same).
	na map[string]string
}

// A guard: the answers it produces and a few words on what it is.
type guard struct {
	answers []string
	by      string
	keys    []string // the attempts it stops; none means any of the case's
}

func g(by string, answers ...string) guard { return guard{answers: answers, by: by} }

// only narrows a guard to some of a case's attempts.
func (gd guard) only(keys ...string) guard {
	gd.keys = keys
	return gd
}

// Columns by kind, for guards shared by several.
const (
	cDocker = "docker"
	cRunsc  = "docker+runsc"
	cCrun   = "oci (crun)"
	cRunc   = "oci (runc)"
	cK8s    = "kubernetes"
	cQEMU   = "qemu"
	cWasm   = "wasm"
)

// on builds a guards map: on("a,b", guards...) adds guards for columns a and b.
type guardMap map[string][]guard

func on(cols string, gs ...guard) guardMap {
	m := guardMap{}
	return m.and(cols, gs...)
}

func (m guardMap) and(cols string, gs ...guard) guardMap {
	for _, c := range strings.Split(cols, ",") {
		m[c] = append(m[c], gs...)
	}
	return m
}

// A verdict for one case on one column.
type verdict struct {
	status string // "blocked", "n/a", "OPEN", "UNEXPECTED"
	cell   string // the table's cell
	detail string // for a failure message
}

// judge turns the observations of one column into the case's verdict there.
func (c escapeCase) judge(col string, obs map[string]string) verdict {
	guards := c.guards[col]
	if guards == nil {
		guards = c.guards["*"]
	}
	na, isNA := c.na[col]
	var opened, unexpected, errnos, bys []string
	for _, k := range c.keys {
		ans, ok := obs[k]
		if !ok {
			unexpected = append(unexpected, k+" was not tried")
			continue
		}
		if strings.HasPrefix(ans, "ok") {
			opened = append(opened, k+": "+ans)
			continue
		}
		if strings.HasPrefix(ans, "nosurface") {
			if !isNA {
				unexpected = append(unexpected, k+"="+ans)
			}
			continue
		}
		for _, part := range strings.Split(ans, ",") {
			if strings.HasPrefix(part, "ok") {
				opened = append(opened, k+": "+part)
				continue
			}
			matched := false
			for _, gd := range guards {
				if slices.Contains(gd.answers, part) && (gd.keys == nil || slices.Contains(gd.keys, k)) {
					matched = true
					if part != "none" && part != "untouched" && !slices.Contains(errnos, part) && isErrno(part) {
						errnos = append(errnos, part)
					}
					if !slices.Contains(bys, gd.by) {
						bys = append(bys, gd.by)
					}
					break
				}
			}
			switch {
			case !matched && isNA && isErrno(part):
				// Where the case has no surface, any refusal is that.
				if !slices.Contains(errnos, part) {
					errnos = append(errnos, part)
				}
			case !matched:
				unexpected = append(unexpected, k+"="+part)
			}
		}
	}
	switch {
	case len(opened) > 0:
		return verdict{status: "OPEN", cell: "OPEN", detail: strings.Join(opened, "; ")}
	case len(unexpected) > 0:
		return verdict{status: "UNEXPECTED", cell: "UNEXPECTED: " + strings.Join(unexpected, "; "), detail: strings.Join(unexpected, "; ")}
	case isNA:
		// No surface: what the attempts met is said, not credited to a guard.
		cell := "n/a: " + na
		if len(errnos) > 0 {
			cell += " (" + strings.Join(errnos, ", ") + ")"
		}
		return verdict{status: "n/a", cell: cell}
	}
	cell := "blocked: " + strings.Join(bys, "; ")
	if len(errnos) > 0 {
		cell = fmt.Sprintf("blocked (%s): %s", strings.Join(errnos, ", "), strings.Join(bys, "; "))
	}
	return verdict{status: "blocked", cell: cell}
}

func isErrno(s string) bool {
	return len(s) > 1 && s[0] == 'E' && strings.ToUpper(s) == s
}

// A known hole: a case that gets through on a column today, with what was seen and
// why, until its fix lands. The run fails if a listed hole is in fact blocked.
type hole struct {
	caseID, col string
	why         string
}
