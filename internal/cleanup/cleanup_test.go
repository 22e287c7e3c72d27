package cleanup

import (
	"context"
	"slices"
	"testing"
)

func TestCleanRunsInReverseOnAContextThatIsNotCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the caller gave up: undoing must still work
	var order []int
	var cu Stack
	for i := range 3 {
		cu.Add(func(ctx context.Context) {
			if ctx.Err() != nil {
				t.Errorf("step %d ran on a cancelled context", i)
			}
			if _, ok := ctx.Deadline(); !ok {
				t.Errorf("step %d ran without a deadline", i)
			}
			order = append(order, i)
		})
	}
	cu.Clean(ctx)
	if !slices.Equal(order, []int{2, 1, 0}) {
		t.Errorf("ran %v, want 2 1 0", order)
	}
	cu.Clean(ctx)
	if len(order) != 3 {
		t.Errorf("a second Clean ran the steps again: %v", order)
	}
}

func TestReleaseKeepsTheWork(t *testing.T) {
	ran := false
	var cu Stack
	cu.Add(func(context.Context) { ran = true })
	cu.Release()
	cu.Clean(context.Background())
	if ran {
		t.Error("an undo step ran after Release")
	}
}
