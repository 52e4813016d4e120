package jolokia_test

import (
	"context"
	"fmt"

	"github.com/pglimit/pglimit/cmd/internal/jolokia"
)

// ReadAll keeps the order of the items across its batches.
func ExampleReadAll() {
	names := make([]string, 450)
	for i := range names {
		names[i] = fmt.Sprintf("q%d", i+1)
	}
	lengths, _ := jolokia.ReadAll(context.Background(), names, jolokia.ReadsPerCall,
		func(_ context.Context, batch []string) ([]int, error) {
			fmt.Println("one call with", len(batch), "reads, from", batch[0])
			out := make([]int, len(batch))
			for i, n := range batch {
				out[i] = len(n)
			}
			return out, nil
		})
	fmt.Println(len(lengths), lengths[0], lengths[449])
	// Output:
	// one call with 200 reads, from q1
	// one call with 200 reads, from q201
	// one call with 50 reads, from q401
	// 450 2 4
}
