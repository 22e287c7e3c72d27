package wasm

// Tiny WebAssembly modules assembled by hand, so that the tests need no toolchain.

// section encodes a module section: its id, then its length and contents.
func section(id byte, contents ...byte) []byte {
	return append(append([]byte{id}, uleb(len(contents))...), contents...)
}

func uleb(n int) []byte {
	var out []byte
	for {
		b := byte(n & 0x7f)
		n >>= 7
		if n != 0 {
			out = append(out, b|0x80)
			continue
		}
		return append(out, b)
	}
}

func name(s string) []byte { return append(uleb(len(s)), s...) }

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var wasmHeader = []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}

// commandModule assembles a module with one memory page exported as "memory" and a
// _start whose body (without locals and final end) is code. When importName is set,
// function 0 is that import, of type (i32) -> (), from importModule; _start is then
// function 1.
func commandModule(importModule, importName string, code ...byte) []byte {
	// type 0: () -> (); type 1: (i32) -> ()
	types := section(1, 0x02, 0x60, 0x00, 0x00, 0x60, 0x01, 0x7f, 0x00)
	var imports []byte
	startIndex := byte(0)
	if importName != "" {
		imports = section(2, cat([]byte{0x01}, name(importModule), name(importName), []byte{0x00, 0x01})...)
		startIndex = 1
	}
	funcs := section(3, 0x01, 0x00)
	memory := section(5, 0x01, 0x00, 0x01)
	exports := section(7, cat([]byte{0x02}, name("_start"), []byte{0x00, startIndex}, name("memory"), []byte{0x02, 0x00})...)
	body := cat([]byte{0x00}, code, []byte{0x0b})
	codeSec := section(10, cat([]byte{0x01}, uleb(len(body)), body)...)
	return cat(wasmHeader, types, imports, funcs, memory, exports, codeSec)
}

var (
	// trapModule's _start executes unreachable.
	trapModule = commandModule("", "", 0x00)
	// exitModule's _start calls proc_exit(7).
	exitModule = commandModule(wasiModule, "proc_exit", 0x41, 0x07, 0x10, 0x00)
	// foreignImportModule imports a function that is not WASI.
	foreignImportModule = commandModule("env", "launch_missiles", 0x41, 0x00, 0x10, 0x00)
	// loopModule's _start spins forever: loop, br 0, end.
	loopModule = commandModule("", "", 0x03, 0x40, 0x0c, 0x00, 0x0b)
	// growModule's _start grows memory by 2048 pages (128 MiB) and traps if refused.
	growModule = commandModule("", "",
		0x41, 0x80, 0x10, // i32.const 2048
		0x40, 0x00, // memory.grow 0
		0x41, 0x7f, // i32.const -1
		0x46,       // i32.eq
		0x04, 0x40, // if
		0x00, // unreachable
		0x0b, // end
	)
	// reactorModule has no _start: only a function called "init".
	reactorModule = cat(wasmHeader,
		section(1, 0x01, 0x60, 0x00, 0x00),
		section(3, 0x01, 0x00),
		section(7, cat([]byte{0x01}, name("init"), []byte{0x00, 0x00})...),
		section(10, 0x01, 0x02, 0x00, 0x0b),
	)
)
