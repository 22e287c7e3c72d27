package pool

// WithIdleSource is withIdleSource, for the tests of package pool_test.
var WithIdleSource = withIdleSource
