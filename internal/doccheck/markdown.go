// Package doccheck checks the repository's Markdown: every relative link leads to a file
// that exists, every anchor to a heading that makes it (by GitHub's rules), and every
// repository path written in backticks (`internal/guest/server`, `go test ./escape/`)
// names something that exists. Links to other sites are listed, not fetched. The test
// reads every Markdown file of the checkout but node_modules'; this file holds the
// parsing it needs, which is a line-based subset of CommonMark: fenced code blocks,
// code spans, ATX and setext headings, inline links, link definitions, autolinks and
// HTML anchors.
package doccheck

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"unicode"
)

// Doc is what one Markdown file says that can be checked.
type Doc struct {
	// Anchors are the fragments its headings (and HTML id and name attributes) make.
	Anchors map[string]bool
	// Links are the targets of its links, in order.
	Links []Ref
	// Paths are the repository-looking paths in its code: whole code spans with a slash
	// (`internal/guest/server`) and words starting with ./ in code spans and code blocks
	// (`go test ./escape/`).
	Paths []Ref
}

// Ref is a link target or a path, and the line it is on (from 1).
type Ref struct {
	Line   int
	Target string
}

// Parse reads a Markdown file's text.
func Parse(text string) Doc {
	d := Doc{Anchors: map[string]bool{}}
	seen := map[string]int{}
	addHeading := func(h string) {
		s := Slug(h)
		n := seen[s]
		seen[s] = n + 1
		if n > 0 {
			s = fmt.Sprintf("%s-%d", s, n)
		}
		d.Anchors[s] = true
	}
	// block holds the lines of the paragraph (or table, or list) being read, from line
	// first: a code span may run from one line to the next within it.
	var block []string
	first := 0
	flush := func() {
		if len(block) > 0 {
			d.inline(first, strings.Join(block, "\n"))
		}
		block = block[:0]
	}
	var fence string // the opening fence while in a code block
	prev := ""       // the previous line, for setext headings; "" after anything else
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		trimmed := strings.TrimLeft(line, " \t")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]+" \t") == "" {
				fence = ""
			} else {
				d.Paths = append(d.Paths, dotPaths(n, line)...)
			}
			continue
		}
		if f := fenceOf(trimmed); f != "" {
			flush()
			fence, prev = f, ""
			continue
		}
		if m := atx.FindStringSubmatch(line); m != nil {
			flush()
			addHeading(m[1])
			d.inline(n, m[1])
			prev = ""
			continue
		}
		if prev != "" && setext.MatchString(line) {
			// The heading's text is the block's last line, already read as text.
			addHeading(prev)
			flush()
			prev = ""
			continue
		}
		if strings.TrimSpace(line) == "" {
			flush()
			prev = ""
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			d.Anchors[m[1]] = true
		}
		if m := definition.FindStringSubmatch(line); m != nil {
			d.Links = append(d.Links, Ref{n, m[1]})
			continue
		}
		if len(block) == 0 {
			first = n
		}
		block = append(block, line)
		if paragraphLine(line) {
			prev = line
		} else {
			prev = ""
		}
	}
	flush()
	return d
}

// inline reads the links and code of a block of text whose first line is line n.
func (d *Doc) inline(n int, text string) {
	for _, seg := range segments(text) {
		ln := n + strings.Count(text[:seg.at], "\n")
		if seg.code {
			d.Paths = append(d.Paths, codePaths(ln, seg.text)...)
			continue
		}
		for _, l := range links(0, seg.text) {
			off := strings.Index(seg.text, l.Target)
			d.Links = append(d.Links, Ref{ln + strings.Count(seg.text[:max(off, 0)], "\n"), l.Target})
		}
	}
}

var (
	atx        = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	setext     = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	htmlAnchor = regexp.MustCompile(`<a\s[^>]*(?:name|id)="([^"]+)"`)
	definition = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?`)
	autolink   = regexp.MustCompile(`<((?:https?|mailto):[^\s>]+)>`)
	bareURL    = regexp.MustCompile(`(?:^|[\s(])(https?://[^\s<>()]+[^\s<>().,;:!?'"*_])`)
	listItem   = regexp.MustCompile(`^\s*(?:[-+*]|\d+[.)])\s`)
)

// fenceOf returns the fence a line opens (``` or ~~~, as long as it is), or "".
func fenceOf(trimmed string) string {
	for _, c := range []string{"`", "~"} {
		if strings.HasPrefix(trimmed, c+c+c) {
			n := len(trimmed) - len(strings.TrimLeft(trimmed, c))
			return strings.Repeat(c, n)
		}
	}
	return ""
}

// paragraphLine says whether a line could be the text of a setext heading: not blank,
// not a list item, table row, heading, quote or HTML.
func paragraphLine(line string) bool {
	t := strings.TrimSpace(line)
	if t == "" || strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t") {
		return false
	}
	switch t[0] {
	case '|', '#', '>', '<':
		return false
	}
	return !listItem.MatchString(line)
}

// segment is a run of text, or one code span's content, starting at byte at.
type segment struct {
	text string
	at   int
	code bool
}

// segments splits text into text and code spans: a run of backticks opens a span that
// the next run of the same length closes; one left unclosed is text. A code span's
// line breaks are spaces, as CommonMark renders them.
func segments(text string) []segment {
	var out []segment
	pos, textAt := 0, 0
	for {
		i := strings.IndexByte(text[pos:], '`')
		if i < 0 {
			break
		}
		i += pos
		n := len(text[i:]) - len(strings.TrimLeft(text[i:], "`"))
		ticks := text[i : i+n]
		j := closing(text[i+n:], ticks)
		if j < 0 {
			pos = i + n
			continue
		}
		out = append(out, segment{text: text[textAt:i], at: textAt},
			segment{text: strings.TrimSpace(strings.ReplaceAll(text[i+n:i+n+j], "\n", " ")), at: i, code: true})
		pos = i + n + j + n
		textAt = pos
	}
	return append(out, segment{text: text[textAt:], at: textAt})
}

// closing is where a run of exactly ticks starts in s, or -1.
func closing(s, ticks string) int {
	for off := 0; off < len(s); {
		i := strings.Index(s[off:], ticks)
		if i < 0 {
			return -1
		}
		at := off + i
		end := at + len(ticks)
		if end < len(s) && s[end] == '`' {
			off = end + len(s[end:]) - len(strings.TrimLeft(s[end:], "`"))
			continue
		}
		return at
	}
	return -1
}

// links finds the targets of inline links and images, autolinks and bare URLs in text
// outside code.
func links(n int, text string) []Ref {
	var out []Ref
	for off := 0; ; {
		i := strings.Index(text[off:], "](")
		if i < 0 {
			break
		}
		start := off + i + 2
		target, end := linkTarget(text[start:])
		if target != "" {
			out = append(out, Ref{n, target})
		}
		off = start + end
	}
	for _, m := range autolink.FindAllStringSubmatch(text, -1) {
		out = append(out, Ref{n, m[1]})
	}
	for _, m := range bareURL.FindAllStringSubmatch(text, -1) {
		if !strings.Contains(text, "]("+m[1]) && !strings.Contains(text, "<"+m[1]) {
			out = append(out, Ref{n, m[1]})
		}
	}
	return out
}

// linkTarget reads a link destination after "](": <...>, or up to the space or the
// unbalanced ")" that ends it. It returns the destination and how much it read.
func linkTarget(s string) (string, int) {
	s0 := len(s)
	s = strings.TrimLeft(s, " ")
	lead := s0 - len(s)
	if strings.HasPrefix(s, "<") {
		if j := strings.IndexByte(s, '>'); j > 0 {
			return s[1:j], lead + j + 1
		}
		return "", lead
	}
	depth := 0
	for i, r := range s {
		switch {
		case r == '(':
			depth++
		case r == ')' && depth == 0:
			return s[:i], lead + i + 1
		case r == ')':
			depth--
		case r == ' ' || r == '\t':
			return s[:i], lead + i
		}
	}
	return s, lead + len(s)
}

// codePaths are a code span's repository-looking paths: the whole span when it is a
// path with a slash, else its words that start with ./ (commands).
func codePaths(n int, code string) []Ref {
	if slashPath.MatchString(code) {
		return []Ref{{n, code}}
	}
	return dotPaths(n, code)
}

var (
	slashPath = regexp.MustCompile(`^(?:\./)?[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+/?(?:/\.\.\.)?$`)
	dotPath   = regexp.MustCompile(`^\./[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/?(?:/\.\.\.)?$`)
)

// dotPaths are the words of text that start with ./ and look like paths.
func dotPaths(n int, text string) []Ref {
	var out []Ref
	for _, w := range strings.Fields(text) {
		w = strings.Trim(w, `"'(),;`)
		if dotPath.MatchString(w) {
			out = append(out, Ref{n, w})
		}
	}
	return out
}

// Slug is the anchor GitHub makes of a heading: its text as rendered (code without its
// backticks, a link's text, no emphasis markers or HTML tags), lower-cased, spaces made
// hyphens, and every character dropped that is not a letter, mark, digit, underscore or
// hyphen.
func Slug(heading string) string {
	var plain strings.Builder
	for _, seg := range segments(heading) {
		if seg.code {
			plain.WriteString(seg.text)
			continue
		}
		t := inlineLink.ReplaceAllString(seg.text, "$1")
		t = htmlTag.ReplaceAllString(t, "")
		t = strings.ReplaceAll(t, "*", "")
		t = emphasisUnderscore.ReplaceAllString(t, "$1$2")
		plain.WriteString(t)
	}
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(plain.String())) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var (
	inlineLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag    = regexp.MustCompile(`</?[A-Za-z][^>]*>`)
	// An underscore that opens or closes emphasis: at a word's edge, not inside one
	// (roche_sandbox keeps its own).
	emphasisUnderscore = regexp.MustCompile(`(^|\W)_+|_+(\W|$)`)
)

// SplitTarget splits a link target into its path (unescaped) and fragment.
func SplitTarget(target string) (path, fragment string) {
	path, fragment, _ = strings.Cut(target, "#")
	if p, err := url.PathUnescape(path); err == nil {
		path = p
	}
	return path, fragment
}

// External says whether a target is another site's (http or https); Scheme whether it
// has a scheme at all (mailto: and the rest are not checked).
func External(target string) bool {
	return strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://")
}

// Scheme says whether a target starts with a URL scheme.
func Scheme(target string) bool { return scheme.MatchString(target) }

var scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
