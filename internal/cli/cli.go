// Package cli parses a binary's words strictly: a table of commands, each a
// name, a one-line summary and a function, from which the usage text is
// generated. A word the table does not know is refused (usage on stderr,
// exit 2) before anything starts, so a mistyped subcommand or flag never
// ends up running the server with the words ignored; help (`help`, `-h`,
// `--help`) prints the usage on stdout and exits 0.
//
// Configuration stays in the environment: a binary's default action (no
// arguments) is its Serve function.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Exit codes.
const (
	ExitOK    = 0
	ExitFail  = 1 // the command ran and failed
	ExitUsage = 2 // the words were refused; nothing ran
)

// Command is one entry of a command table: a verb (Run set) or a group of
// verbs (Sub set, Run nil), such as `policy` with check, explain, replay.
// Adding a verb is adding one entry.
type Command struct {
	Name    string
	Args    string // the synopsis of its arguments in the usage text, e.g. "FILE [--json]"
	Summary string // one line
	// Run gets the words after the verb and returns the exit code. It
	// handles its own -h/--help (Parse and FlagExit below make that one
	// line).
	Run func(args []string, stdout, stderr io.Writer) int
	Sub []Command
}

// Program is a binary's words.
type Program struct {
	Name string // the binary's name, as typed
	// Doc is printed under the usage lines: what the binary does when run
	// without arguments, and where its configuration is described.
	Doc      string
	Commands []Command
	// Serve is the default action, run when there are no arguments.
	Serve func() int
}

// isHelp reports whether a word asks for help.
func isHelp(w string) bool {
	return w == "help" || w == "-h" || w == "-help" || w == "--help"
}

// Main dispatches args (os.Args[1:]) and returns the exit code.
func (p Program) Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return p.Serve()
	}
	if isHelp(args[0]) {
		if args[0] == "help" && len(args) > 1 { // help policy, help policy check
			return p.help(args[1:], stdout, stderr)
		}
		p.Usage(stdout)
		return ExitOK
	}
	return p.dispatch(nil, p.Commands, args, stdout, stderr)
}

// dispatch runs the command args names in table, under the words of path.
func (p Program) dispatch(path []string, table []Command, args []string, stdout, stderr io.Writer) int {
	word := args[0]
	c := find(table, word)
	if c == nil {
		what := "unknown command"
		if strings.HasPrefix(word, "-") {
			what = "unknown flag"
		}
		fmt.Fprintf(stderr, "%s: %s %q\n\n", p.spell(path), what, word)
		p.usageOf(stderr, path, table)
		return ExitUsage
	}
	path = append(path, c.Name)
	if c.Run != nil {
		return c.Run(args[1:], stdout, stderr)
	}
	switch rest := args[1:]; {
	case len(rest) == 0:
		fmt.Fprintf(stderr, "%s: a command is required\n\n", p.spell(path))
		p.usageOf(stderr, path, c.Sub)
		return ExitUsage
	case isHelp(rest[0]):
		p.usageOf(stdout, path, c.Sub)
		return ExitOK
	default:
		return p.dispatch(path, c.Sub, rest, stdout, stderr)
	}
}

// help answers `help WORDS...`: a group's usage, or a verb's own --help.
func (p Program) help(words []string, stdout, stderr io.Writer) int {
	table, path := p.Commands, []string(nil)
	for i, w := range words {
		c := find(table, w)
		if c == nil || (c.Run != nil && i != len(words)-1) {
			fmt.Fprintf(stderr, "%s: no help for %q\n\n", p.Name, strings.Join(words, " "))
			p.Usage(stderr)
			return ExitUsage
		}
		if c.Run != nil {
			return c.Run([]string{"--help"}, stdout, stderr)
		}
		path, table = append(path, c.Name), c.Sub
	}
	p.usageOf(stdout, path, table)
	return ExitOK
}

func find(table []Command, name string) *Command {
	for i := range table {
		if table[i].Name == name {
			return &table[i]
		}
	}
	return nil
}

func (p Program) spell(path []string) string {
	return strings.Join(append([]string{p.Name}, path...), " ")
}

// Usage writes the whole program's usage, generated from the table.
func (p Program) Usage(w io.Writer) {
	p.usageOf(w, nil, p.Commands)
}

// usageOf writes the usage of the commands table under path (nil: the
// program itself, with its Doc).
func (p Program) usageOf(w io.Writer, path []string, table []Command) {
	prefix := p.spell(path)
	if path == nil {
		fmt.Fprintf(w, "usage: %s\n", p.Name)
		if len(table) > 0 {
			fmt.Fprintf(w, "       %s COMMAND [ARGS]\n", p.Name)
		}
		fmt.Fprintf(w, "       %s help [COMMAND]\n", p.Name)
		if p.Doc != "" {
			fmt.Fprintf(w, "\n%s\n", strings.TrimRight(p.Doc, "\n"))
		}
	} else {
		fmt.Fprintf(w, "usage: %s COMMAND [ARGS]\n", prefix)
	}
	var rows [][2]string
	var walk func(pre string, t []Command)
	walk = func(pre string, t []Command) {
		for _, c := range t {
			name := strings.TrimPrefix(pre+" "+c.Name, " ")
			if c.Run == nil {
				walk(name, c.Sub)
				continue
			}
			if c.Args != "" {
				name += " " + c.Args
			}
			rows = append(rows, [2]string{name, c.Summary})
		}
	}
	walk("", table)
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\ncommands:")
	for _, r := range rows {
		fmt.Fprintf(w, "  %s %s\n      %s\n", prefix, r[0], r[1])
	}
	fmt.Fprintf(w, "\n`%s help COMMAND` or `%s COMMAND --help` describes one.\n", p.Name, prefix)
}

// NewFlagSet is a flag set for a verb that prints nothing by itself: its
// Parse errors, help included, go to FlagExit.
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// Parse parses args with fs, flags and positional words in any order (FILE
// before or after the flags; after "--" every word is positional), and
// returns the positional words.
func Parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			return pos, err
		}
		rest = fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag stops at the first positional word, or after "--".
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args, rest = rest[1:], rest[1:]
	}
}

// FlagExit turns a Parse error into the exit: help prints usage and the
// flags on stdout (0); anything else prints the error, usage and flags on
// stderr (2).
func FlagExit(err error, fs *flag.FlagSet, usage string, stdout, stderr io.Writer) int {
	if errors.Is(err, flag.ErrHelp) {
		writeFlagUsage(stdout, fs, usage)
		return ExitOK
	}
	fmt.Fprintf(stderr, "%s: %v\n\n", fs.Name(), err)
	writeFlagUsage(stderr, fs, usage)
	return ExitUsage
}

// Refuse prints a problem with otherwise well-formed words (a missing FILE,
// flags that exclude each other) and the usage on stderr, and returns 2.
func Refuse(problem string, fs *flag.FlagSet, usage string, stderr io.Writer) int {
	fmt.Fprintf(stderr, "%s: %s\n\n", fs.Name(), problem)
	writeFlagUsage(stderr, fs, usage)
	return ExitUsage
}

func writeFlagUsage(w io.Writer, fs *flag.FlagSet, usage string) {
	fmt.Fprintln(w, strings.TrimRight(usage, "\n"))
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}
