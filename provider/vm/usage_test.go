package vm_test

import (
	"context"
	"testing"

	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestUsageQEMU: the console's live figures of a microVM, the whole VM's as its guest
// kernel counts them, read by roche-agent over the VM's link: they grow by what a
// command in it keeps and burns.
func TestUsageQEMU(t *testing.T) {
	p := newQEMU(t)
	ctx := context.Background()
	info, err := p.Create(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(context.WithoutCancel(ctx), info.ID)
	providertest.UsageGrows(t, p, info.ID)
}
