package heavy_test

import "runtime"

// testingProcs is GOMAXPROCS: RunParallel starts parallelism × this many
// goroutines.
func testingProcs() int { return runtime.GOMAXPROCS(0) }
