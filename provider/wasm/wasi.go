package wasm

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// WASI preview1 layout of poll_oneoff's subscription records.
const (
	subscriptionSize  = 48
	subTagOffset      = 8  // u8: 0 clock, 1 fd_read, 2 fd_write
	subClockIDOffset  = 16 // u32
	subTimeoutOffset  = 24 // u64 nanoseconds
	subFlagsOffset    = 40 // u16
	eventTypeClock    = 0
	clockRealtime     = 0
	clockMonotonic    = 1
	subClockAbstime   = 1
	pollOneoffName    = "poll_oneoff"
	pollOneoffResults = 1
)

// monotonicBase is the zero of the monotonic clock guests see. The provider supplies the
// clock (see guestNanotime) so that poll_oneoff can convert a guest's absolute
// monotonic deadline into a duration.
var monotonicBase = time.Now()

func guestNanotime() int64 { return int64(time.Since(monotonicBase)) }

// instantiateWASI instantiates wasi_snapshot_preview1 as wazero implements it, except
// that poll_oneoff also accepts clock subscriptions with an absolute deadline. wazero
// answers those with ENOTSUP, and CPython's time.sleep uses exactly that
// (clock_nanosleep with TIMER_ABSTIME), so without this every sleep fails. The wrapper
// rewrites such a deadline into the relative timeout it amounts to, lets wazero's
// implementation do the waiting, then restores the guest's record.
func instantiateWASI(ctx context.Context, r wazero.Runtime) error {
	stockBuilder := r.NewHostModuleBuilder(wasiModule)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(stockBuilder)
	stockCompiled, err := stockBuilder.Compile(ctx)
	if err != nil {
		return err
	}
	def, ok := stockCompiled.ExportedFunctions()[pollOneoffName]
	if !ok {
		return fmt.Errorf("wazero's WASI has no %s", pollOneoffName)
	}
	stock, ok := def.GoFunction().(api.GoModuleFunction)
	if !ok {
		return fmt.Errorf("wazero's WASI %s is a %T, not a Go module function", pollOneoffName, def.GoFunction())
	}
	params, results := def.ParamTypes(), def.ResultTypes()
	if len(params) != 4 || len(results) != pollOneoffResults {
		return fmt.Errorf("wazero's WASI %s has an unexpected signature", pollOneoffName)
	}

	b := r.NewHostModuleBuilder(wasiModule)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(b)
	b.NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, mod api.Module, stack []uint64) {
			restore := absoluteToRelative(mod.Memory(), uint32(stack[0]), uint32(stack[2]))
			stock.Call(ctx, mod, stack)
			restore()
		}), params, results).
		WithParameterNames(def.ParamNames()...).
		WithResultNames(def.ResultNames()...).
		Export(pollOneoffName)
	for _, name := range spaceFunctions {
		def, ok := stockCompiled.ExportedFunctions()[name]
		if !ok {
			return fmt.Errorf("wazero's WASI has no %s", name)
		}
		stock, ok := def.GoFunction().(api.GoModuleFunction)
		if !ok || len(def.ResultTypes()) != 1 {
			return fmt.Errorf("wazero's WASI %s is a %T with %d results, not a Go module function with an errno", name, def.GoFunction(), len(def.ResultTypes()))
		}
		b.NewFunctionBuilder().
			WithGoModuleFunction(noSpaceAsENOSPC(stock), def.ParamTypes(), def.ResultTypes()).
			WithParameterNames(def.ParamNames()...).
			WithResultNames(def.ResultNames()...).
			Export(name)
	}
	_, err = b.Instantiate(ctx)
	return err
}

// spaceFunctions are the WASI calls that can make a file grow or make an entry, and so
// run into a quota, or open a file, and so run into the cap on open files.
var spaceFunctions = []string{"fd_write", "fd_pwrite", "fd_filestat_set_size", "fd_allocate",
	"path_open", "path_create_directory", "path_link"}

// WASI errno values (the preview1 errno enum).
const (
	wasiErrnoIO    = 29
	wasiErrnoMfile = 33
	wasiErrnoNoSpc = 51
)

// noSpaceAsENOSPC wraps a WASI call so that a write or create refused by a quota (see
// quota) fails with ENOSPC, as on a full disk, and an open refused by the sandbox's cap
// on open files (see openFiles) with EMFILE, as past RLIMIT_NOFILE. wazero's errno set
// has neither, so the refusal reaches the call as EIO; the quota or cap also raises the
// instance's spaceSignal, carried in the call's context, which tells that EIO apart
// from a host's I/O error.
func noSpaceAsENOSPC(stock api.GoModuleFunction) api.GoModuleFunc {
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		sig, _ := ctx.Value(spaceSignalKey{}).(*spaceSignal)
		if sig == nil {
			stock.Call(ctx, mod, stack)
			return
		}
		sig.refused.Store(false)
		sig.files.Store(false)
		stock.Call(ctx, mod, stack)
		switch {
		case stack[0] != wasiErrnoIO:
		case sig.refused.Load():
			stack[0] = wasiErrnoNoSpc
		case sig.files.Load():
			stack[0] = wasiErrnoMfile
		}
	}
}

// spaceSignal is raised by an instance's quotas when they refuse a write or a create,
// and by its file systems when the sandbox's cap on open files refuses an open; one
// instance runs one call at a time, so it says whether the call under way was refused.
type spaceSignal struct{ refused, files atomic.Bool }

// tooMany reports an open refused by the cap on open files: errNoSpace, with the
// signal's files flag raised.
func (s *spaceSignal) tooMany() experimentalsys.Errno {
	if s != nil {
		s.files.Store(true)
	}
	return errNoSpace
}

type spaceSignalKey struct{}

// withSpaceSignal is the context for calls into an instance whose quotas raise sig.
func withSpaceSignal(ctx context.Context, sig *spaceSignal) context.Context {
	return context.WithValue(ctx, spaceSignalKey{}, sig)
}

// absoluteToRelative rewrites, in guest memory, every absolute clock subscription of the
// n records at in into a relative one, and returns what puts the records back. Records
// it cannot read are left for wazero to reject.
func absoluteToRelative(mem api.Memory, in, n uint32) (restore func()) {
	noop := func() {}
	if mem == nil || n == 0 || n > 1<<16 {
		return noop
	}
	buf, ok := mem.Read(in, n*subscriptionSize)
	if !ok {
		return noop
	}
	type saved struct {
		off     uint32
		timeout uint64
		flags   uint16
	}
	var changed []saved
	le := binary.LittleEndian
	for i := uint32(0); i < n; i++ {
		rec := buf[i*subscriptionSize : (i+1)*subscriptionSize]
		if rec[subTagOffset] != eventTypeClock || le.Uint16(rec[subFlagsOffset:]) != subClockAbstime {
			continue
		}
		deadline := int64(le.Uint64(rec[subTimeoutOffset:]))
		var now int64
		switch le.Uint32(rec[subClockIDOffset:]) {
		case clockRealtime:
			now = time.Now().UnixNano()
		case clockMonotonic:
			now = guestNanotime()
		default:
			continue // CPU-time clocks: wazero rejects them either way
		}
		changed = append(changed, saved{off: i * subscriptionSize, timeout: uint64(deadline), flags: subClockAbstime})
		le.PutUint64(rec[subTimeoutOffset:], uint64(max(deadline-now, 0)))
		le.PutUint16(rec[subFlagsOffset:], 0)
	}
	if len(changed) == 0 {
		return noop
	}
	return func() {
		// The guest may have grown (and so moved) its memory meanwhile: read it again.
		buf, ok := mem.Read(in, n*subscriptionSize)
		if !ok {
			return
		}
		for _, s := range changed {
			le.PutUint64(buf[s.off+subTimeoutOffset:], s.timeout)
			le.PutUint16(buf[s.off+subFlagsOffset:], s.flags)
		}
	}
}
