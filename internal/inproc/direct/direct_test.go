package direct

import (
	"maps"
	"slices"
	"testing"

	"github.com/roche-sandbox/roche/internal/catalog"
)

// TestConstructorsAreDirect: the providers roche-run links are the ones the thin roche
// hands to it (catalog.Direct, which is rocherun.Direct), no more and no fewer, and each
// is a provider of the catalog.
func TestConstructorsAreDirect(t *testing.T) {
	linked := slices.Sorted(maps.Keys(Constructors))
	if !slices.Equal(linked, catalog.Direct) {
		t.Errorf("roche-run links %v, the thin roche hands it %v", linked, catalog.Direct)
	}
	for _, name := range linked {
		if _, err := catalog.Lookup(name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
