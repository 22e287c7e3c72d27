package wire

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/roche-sandbox/roche"
)

// What roched's CopyFrom left out of the stream travels in its response trailer, as the
// proto's comment on CopyFromRequest.preserve_links says: the counts, and each example
// as a JSON roche.SkippedEntry. Both directions are here.
const (
	trailerSkipped      = "Roche-Skipped"
	trailerSkippedLinks = "Roche-Skipped-Links"
	trailerExample      = "Roche-Skipped-Example"
)

// SetSkipped writes what r left out into a CopyFrom response trailer (roched's side).
func SetSkipped(h http.Header, r roche.CopyReport) {
	if r.Skipped == 0 {
		return
	}
	h.Set(trailerSkipped, strconv.Itoa(r.Skipped))
	h.Set(trailerSkippedLinks, strconv.Itoa(r.SkippedLinks))
	for _, e := range r.Examples {
		if b, err := json.Marshal(e); err == nil {
			h.Add(trailerExample, string(b))
		}
	}
}

// Skipped reads what a CopyFrom response trailer says was left out (the client's side).
func Skipped(h http.Header) roche.CopyReport {
	var r roche.CopyReport
	r.Skipped, _ = strconv.Atoi(h.Get(trailerSkipped))
	r.SkippedLinks, _ = strconv.Atoi(h.Get(trailerSkippedLinks))
	// A count is never negative, whatever the trailer says.
	r.Skipped, r.SkippedLinks = max(r.Skipped, 0), max(r.SkippedLinks, 0)
	for _, v := range h.Values(trailerExample) {
		var e roche.SkippedEntry
		if json.Unmarshal([]byte(v), &e) == nil {
			r.Examples = append(r.Examples, e)
		}
	}
	return r
}
