package cli

// testLocal is what the tests run in this process: the full CLI's (internal/cli/full),
// which imports this package, so an external test file sets it (full_test.go) before
// TestMain runs.
var testLocal Local

// SetTestLocal sets testLocal.
func SetTestLocal(l Local) { testLocal = l }
