package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/size"
)

// roche files: the files API, one file or directory at a time (roche cp moves trees as
// archives). Through roched it is the daemon's (its caps and tenants); in direct mode the
// provider's, in this process.

// fileEntry is a path as roche files prints it with --json, named as E2B's EntryInfo.
type fileEntry struct {
	Name          string    `json:"name"`
	Type          string    `json:"type"`
	Path          string    `json:"path"`
	Size          int64     `json:"size"`
	Mode          string    `json:"mode"` // octal permission bits
	Permissions   string    `json:"permissions"`
	Owner         string    `json:"owner"`
	Group         string    `json:"group"`
	ModifiedTime  time.Time `json:"modified_time"`
	SymlinkTarget string    `json:"symlink_target,omitempty"`
	UID           int       `json:"uid"`
	GID           int       `json:"gid"`
}

func entryOf(fi roche.FileInfo) fileEntry {
	return fileEntry{
		Name: fi.Name, Type: fi.FileType(), Path: fi.Path, Size: fi.Size,
		Mode: strconv.FormatUint(uint64(fi.Mode.Perm()), 8), Permissions: fi.Mode.String(),
		Owner: fi.Owner, Group: fi.Group, ModifiedTime: fi.ModTime, SymlinkTarget: fi.Symlink,
		UID: fi.UID, GID: fi.GID,
	}
}

// The optional calls of roched's client (client.Provider), used where a provider has them.
type (
	readLimiter interface {
		ReadFileLimit(ctx context.Context, id, src string, w io.Writer, maxBytes int64) (roche.FileInfo, error)
	}
	writeLimiter interface {
		WriteFileLimit(ctx context.Context, id, dst string, r io.Reader, mode fs.FileMode, maxBytes int64) (roche.FileInfo, error)
	}
	existsAsker interface {
		Exists(ctx context.Context, id, name string) (bool, error)
	}
	dirMaker interface {
		MakeDir(ctx context.Context, id, dir string) (roche.FileInfo, bool, error)
	}
)

// fileSystem finds sandbox id's provider and its files API.
func (e *env) fileSystem(id string) (roche.Provider, roche.FileSystem, error) {
	p, err := e.providers.forID(id)
	if err != nil {
		return nil, nil, err
	}
	fsys, ok := p.(roche.FileSystem)
	if !ok || !p.Capabilities().Files {
		return nil, nil, fmt.Errorf("%w: the %s provider has no files API", roche.ErrUnsupported, p.Name())
	}
	return p, fsys, nil
}

// capped fails a copy past max bytes.
type capped struct {
	w    io.Writer
	r    io.Reader
	n    int64
	max  int64
	path string
}

func (c *capped) Write(p []byte) (int, error) {
	if c.n += int64(len(p)); c.n > c.max {
		return 0, fmt.Errorf("%w: %s grew past --max-bytes %s while it was read", roche.ErrExhausted, c.path, size.String(c.max))
	}
	return c.w.Write(p)
}

func (c *capped) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.n += int64(n); c.n > c.max {
		return 0, fmt.Errorf("%w: the content for %s is more than --max-bytes %s", roche.ErrExhausted, c.path, size.String(c.max))
	}
	return n, err
}

func (e *env) filesCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "files ls|stat|exists|cat|write|mkdir|mv|rm|watch ID PATH",
		Short: "Read, write, list and watch a sandbox's files, one at a time",
		Long: `The files API (the SDKs' sandbox.files), one file or directory at a time; roche cp copies
trees as archives. Every call acts as the sandbox user: it reads and writes what the
sandbox's code could, no more, and files it makes are that user's. PATH is absolute; one
with ".." is refused, not cleaned. No symlink is followed: a path that is or goes through
one is refused (a symlink is described, renamed or removed itself), so a link the
sandbox planted cannot redirect a call. Nothing in /proc is served. Content is streamed
both ways: a file of any size moves in bounded memory.

  cat    prints a regular file: what it held when the read began (what is appended
         meanwhile is not sent). A directory, FIFO or device is refused; a file over
         --max-bytes (default 1g; through roched its --copy-max-bytes too) is refused
         before any of it is printed.
  write  writes standard input to a file, replacing it and making its parents; past
         --max-bytes or the sandbox's disk space it fails and leaves no file.
  ls     lists a directory to --depth levels (1 to 64), each directory's entries in name
         order before what is below them; at most 100,000 entries.
  stat   describes a path; exists prints true or false (an unknown sandbox is an error).
  mkdir  makes a directory and its parents (--json says whether it made it).
  mv     renames within one filesystem of the sandbox; rm removes, directories whole.
  watch  prints changes below a directory as they happen (create, write, remove,
         rename, chmod), until Ctrl-C or the directory goes; --recursive covers the
         directories below it, later ones too. Events a slow reader cannot take are
         dropped and counted in an overflow line, never silently. Through roche-agent
         it is inotify in the sandbox (counted against the sandbox user's own inotify
         limits); on wasm it polls, every quarter second.`,
		Example: `  roche files write "$id" /tmp/data.csv < data.csv
  roche files cat "$id" /tmp/out.json | jq .
  roche files ls --depth 2 "$id" /tmp
  roche files watch --recursive "$id" /workspace`,
	}
	c.AddCommand(e.filesLs(), e.filesStat(), e.filesExists(), e.filesCat(), e.filesWrite(), e.filesMkdir(),
		e.filesMv(), e.filesRm(), e.filesWatch())
	return c
}

func (e *env) filesLs() *cobra.Command {
	var depth int
	var asJSON bool
	c := &cobra.Command{
		Use:     "ls [--depth N] [--json] ID PATH",
		Short:   "List a directory",
		Example: `  roche files ls --depth 2 "$id" /tmp`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, fsys, err := e.fileSystem(args[0])
			if err != nil {
				return err
			}
			var list []roche.FileInfo
			add := func(fi roche.FileInfo) error { list = append(list, fi); return nil }
			if dw, ok := p.(roche.DirWalker); ok {
				err = dw.WalkDir(cmd.Context(), args[0], args[1], depth, 0, add)
			} else if depth == 1 {
				list, err = fsys.ListDir(cmd.Context(), args[0], args[1])
			} else {
				err = fmt.Errorf("%w: the %s provider lists one level at a time: give --depth 1", roche.ErrUnsupported, p.Name())
			}
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]fileEntry, len(list))
				for i, fi := range list {
					out[i] = entryOf(fi)
				}
				return e.printJSON(out)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 1, ' ', 0)
			for _, fi := range list {
				name := fi.Path
				if fi.Symlink != "" {
					name += " -> " + fi.Symlink
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", fi.Mode, orID(fi.Owner, fi.UID), orID(fi.Group, fi.GID), fi.Size,
					fi.ModTime.Format("2006-01-02 15:04"), name)
			}
			return tw.Flush()
		},
	}
	c.Flags().IntVar(&depth, "depth", 1, "how many levels to list: 1 is the directory's entries (at most 64)")
	c.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of entries (name, type, path, size, mode, permissions, owner, group, modified_time, symlink_target)")
	return c
}

func orID(name string, id int) string {
	if name != "" {
		return name
	}
	return strconv.Itoa(id)
}

func (e *env) filesStat() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:     "stat [--json] ID PATH",
		Short:   "Describe a path (a symlink itself, not what it points to)",
		Example: `  roche files stat --json "$id" /tmp/data.csv`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, fsys, err := e.fileSystem(args[0])
			if err != nil {
				return err
			}
			fi, err := fsys.Stat(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(entryOf(fi))
			}
			en := entryOf(fi)
			fmt.Fprintf(e.stdout, "path: %s\ntype: %s\nsize: %d\nmode: %s (%s)\nowner: %s (%d)\ngroup: %s (%d)\nmodified: %s\n",
				en.Path, en.Type, en.Size, en.Mode, en.Permissions, en.Owner, en.UID, en.Group, en.GID,
				en.ModifiedTime.Format(time.RFC3339))
			if en.SymlinkTarget != "" {
				fmt.Fprintf(e.stdout, "symlink to: %s\n", en.SymlinkTarget)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the entry as JSON")
	return c
}

func (e *env) filesExists() *cobra.Command {
	return &cobra.Command{
		Use:     "exists ID PATH",
		Short:   "Print true or false: whether a path exists (an unknown sandbox is an error)",
		Example: `  [ "$(roche files exists "$id" /tmp/done)" = true ] && echo finished`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, fsys, err := e.fileSystem(args[0])
			if err != nil {
				return err
			}
			var ok bool
			if ea, has := p.(existsAsker); has {
				ok, err = ea.Exists(cmd.Context(), args[0], args[1])
			} else {
				_, err = fsys.Stat(cmd.Context(), args[0], args[1])
				ok = err == nil
				if errors.Is(err, roche.ErrNotFound) {
					// A missing path, unless the sandbox itself is what is missing.
					_, err = p.Inspect(cmd.Context(), args[0])
				}
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, ok)
			return nil
		},
	}
}

func (e *env) filesCat() *cobra.Command {
	var maxBytes string
	c := &cobra.Command{
		Use:     "cat [--max-bytes SIZE] ID PATH",
		Short:   "Print a file's content",
		Example: `  roche files cat "$id" /tmp/out.json`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			max, err := size.Parse(maxBytes)
			if err != nil {
				return fmt.Errorf("--max-bytes: %w", err)
			}
			p, fsys, err := e.fileSystem(args[0])
			if err != nil {
				return err
			}
			if rl, ok := p.(readLimiter); ok {
				_, err = rl.ReadFileLimit(cmd.Context(), args[0], args[1], e.stdout, max)
				return err
			}
			fi, err := fsys.Stat(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if fi.Size > max {
				return fmt.Errorf("%w: %s is %s, over --max-bytes %s", roche.ErrExhausted, args[1], size.String(fi.Size), size.String(max))
			}
			return fsys.ReadFile(cmd.Context(), args[0], args[1], &capped{w: e.stdout, max: max, path: args[1]})
		},
	}
	c.Flags().StringVar(&maxBytes, "max-bytes", "1g", "refuse a file larger than this, e.g. 512m or 4g")
	return c
}

func (e *env) filesWrite() *cobra.Command {
	var maxBytes, mode string
	var asJSON bool
	c := &cobra.Command{
		Use:     "write [--mode 644] [--max-bytes SIZE] [--json] ID PATH < CONTENT",
		Short:   "Write standard input to a file, replacing it and making its parents",
		Example: `  roche files write --mode 755 "$id" /tmp/run.sh < run.sh`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			max, err := size.Parse(maxBytes)
			if err != nil {
				return fmt.Errorf("--max-bytes: %w", err)
			}
			bits, err := strconv.ParseUint(mode, 8, 32)
			if err != nil || bits > 0o777 {
				return fmt.Errorf("%w: --mode %q: give octal permission bits such as 644 or 755", roche.ErrInvalidConfig, mode)
			}
			p, fsys, err := e.fileSystem(args[0])
			if err != nil {
				return err
			}
			var fi roche.FileInfo
			if wl, ok := p.(writeLimiter); ok {
				fi, err = wl.WriteFileLimit(cmd.Context(), args[0], args[1], e.stdin, fs.FileMode(bits), max)
			} else {
				in := &capped{r: e.stdin, max: max, path: args[1]}
				if err = fsys.WriteFile(cmd.Context(), args[0], args[1], in, fs.FileMode(bits)); err == nil && asJSON {
					fi, err = fsys.Stat(cmd.Context(), args[0], args[1])
				}
			}
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(entryOf(fi))
			}
			return nil
		},
	}
	c.Flags().StringVar(&maxBytes, "max-bytes", "1g", "refuse more content than this, e.g. 512m or 4g")
	c.Flags().StringVar(&mode, "mode", "644", "the file's permission bits, in octal")
	c.Flags().BoolVar(&asJSON, "json", false, "print what was written (the entry) as JSON")
	return c
}

func (e *env) filesMkdir() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:     "mkdir [--json] ID PATH",
		Short:   "Make a directory and its missing parents",
		Example: `  roche files mkdir "$id" /tmp/out/run-1`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, fsys, err := e.fileSystem(args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var fi roche.FileInfo
			var made bool
			if dm, ok := p.(dirMaker); ok {
				fi, made, err = dm.MakeDir(ctx, args[0], args[1])
			} else {
				fi, err = fsys.Stat(ctx, args[0], args[1])
				switch {
				case err == nil && !fi.Mode.IsDir():
					err = fmt.Errorf("%w: %s exists and is not a directory", roche.ErrInvalidConfig, args[1])
				case errors.Is(err, roche.ErrNotFound):
					if err = fsys.Mkdir(ctx, args[0], args[1]); err == nil {
						made = true
						fi, err = fsys.Stat(ctx, args[0], args[1])
					}
				}
			}
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(struct {
					Created bool      `json:"created"`
					Entry   fileEntry `json:"entry"`
				}{made, entryOf(fi)})
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, `print {"created": true|false, "entry": {...}}`)
	return c
}

func (e *env) filesMv() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:     "mv [--json] ID OLD NEW",
		Short:   "Rename a path (within one filesystem of the sandbox)",
		Example: `  roche files mv "$id" /tmp/a.txt /tmp/b.txt`,
		Args:    cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, fsys, err := e.fileSystem(args[0])
			if err != nil {
				return err
			}
			if err := fsys.Rename(cmd.Context(), args[0], args[1], args[2]); err != nil {
				return err
			}
			if !asJSON {
				return nil
			}
			fi, err := fsys.Stat(cmd.Context(), args[0], args[2])
			if err != nil {
				return err
			}
			return e.printJSON(entryOf(fi))
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the entry at its new name as JSON")
	return c
}

func (e *env) filesRm() *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID PATH",
		Short:   "Remove a path, a directory with everything below it",
		Example: `  roche files rm "$id" /tmp/out`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, fsys, err := e.fileSystem(args[0])
			if err != nil {
				return err
			}
			return fsys.Remove(cmd.Context(), args[0], args[1])
		},
	}
}

func (e *env) filesWatch() *cobra.Command {
	var recursive, asJSON bool
	c := &cobra.Command{
		Use:   "watch [--recursive] [--json] ID PATH",
		Short: "Print changes below a directory as they happen, until Ctrl-C",
		Long: `Print each change below the directory PATH (its entries, and with --recursive every
directory below it, later ones included) as a line "TYPE NAME", NAME relative to PATH:
create, write, remove, rename (the old name; the new one inside PATH is a create), chmod,
and overflow with how many events were dropped when the reader fell behind. "watching"
on standard error says when the watch is in place. It ends with Ctrl-C (exit 0), or when
PATH itself is removed or renamed (its own event, NAME empty, is the last). --json prints
{"type":"started"} first, then {"type":"create","name":"a.txt"} per change.`,
		Example: `  roche files watch --recursive "$id" /workspace`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, _, err := e.fileSystem(args[0])
			if err != nil {
				return err
			}
			dw, ok := p.(roche.DirWatcher)
			if !ok {
				return fmt.Errorf("%w: the %s provider cannot watch directories", roche.ErrUnsupported, p.Name())
			}
			enc := json.NewEncoder(e.stdout) // each line one write: a reader sees it at once
			opts := roche.WatchOptions{Recursive: recursive, Started: func() {
				if asJSON {
					_ = enc.Encode(map[string]string{"type": "started"})
				}
				fmt.Fprintf(e.stderr, "watching %s in %s (Ctrl-C to stop)\n", args[1], args[0])
			}}
			err = dw.WatchDir(cmd.Context(), args[0], args[1], opts, func(ev roche.FileEvent) error {
				var err error
				if asJSON {
					err = enc.Encode(ev)
				} else if ev.Op == roche.FileOverflow {
					_, err = fmt.Fprintf(e.stdout, "overflow\t%d events lost\n", ev.Lost)
				} else {
					_, err = fmt.Fprintf(e.stdout, "%s\t%s\n", ev.Op, ev.Name)
				}
				return err
			})
			if err != nil && cmd.Context().Err() != nil {
				return nil // Ctrl-C
			}
			return err
		},
	}
	c.Flags().BoolVar(&recursive, "recursive", false, "watch every directory below PATH too, those made later included")
	c.Flags().BoolVar(&asJSON, "json", false, `print JSON lines: {"type":"started"}, then {"type":"create","name":"a.txt"} ("lost" on overflow)`)
	return c
}
