package samples

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// PythonTimes asks a benchmark's Python side (a process reading "KIND K" lines on in
// and answering each with a JSON list of nanoseconds on out) for k timed runs of kind.
func PythonTimes(in io.Writer, out *bufio.Scanner, kind string, k int) ([]time.Duration, error) {
	if _, err := fmt.Fprintf(in, "%s %d\n", kind, k); err != nil {
		return nil, err
	}
	if !out.Scan() {
		return nil, fmt.Errorf("the Python side stopped during %q (see its error above)", kind)
	}
	var ns []int64
	if err := json.Unmarshal(out.Bytes(), &ns); err != nil {
		return nil, fmt.Errorf("the Python side answered %q: %v", strings.TrimSpace(out.Text()), err)
	}
	ds := make([]time.Duration, len(ns))
	for i, v := range ns {
		ds[i] = time.Duration(v)
	}
	return ds, nil
}
