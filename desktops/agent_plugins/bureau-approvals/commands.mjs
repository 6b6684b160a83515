// Which of the policy's commands a shell command line runs, read as the shell splits it rather than as
// text: `/usr/bin/git push`, `git -C repo push`, `'git' push`, `g\it push`, `FOO=1 sudo x`,
// `G=git; $G push`, `$(which git) push` and `sh -c "git push"` all run one. A pattern ("git push") holds when a word of a
// simple command is its first word (by basename) and its other words follow, in order, among that
// command's words. Quoted words are read again as command lines, as `sh -c`, `eval` or `python -c`
// would run them: the gate errs towards asking. What a script or a program runs in turn stays out of
// its sight; the control plane's network gate holds those.

// Operators that end a simple command.
const OPERATORS = ["&&", "||", "|&", ";;", ";", "&", "|", "(", ")", "{", "}", "\n", "!"];
// What a word becomes where the shell would put a command's output or a variable it cannot know here.
const UNKNOWN = "\u0000";
// How deep quoted command lines are read again.
const MAX_DEPTH = 4;

// Where the command substitution opened just before `from` ends (`$(` … `)`, nested ones inside).
function substitutionEnd(line, from) {
  let depth = 1;
  for (let i = from; i < line.length; i += 1) {
    if (line[i] === "\\") i += 1;
    else if (line[i] === "(") depth += 1;
    else if (line[i] === ")" && --depth === 0) return i;
  }
  return line.length;
}

// The simple commands of a line, each a list of words with the shell's quoting removed, and the
// command lines it substitutes (`$(…)`, backticks), to be read in turn.
function simpleCommands(line) {
  const commands = [];
  const substituted = [];
  let words = [];
  let word = null;
  const endWord = () => {
    if (word !== null) words.push(word);
    word = null;
  };
  const endCommand = () => {
    endWord();
    if (words.length) commands.push(words);
    words = [];
  };
  let i = 0;
  while (i < line.length) {
    const c = line[i];
    if (c === "\\") {
      // A backslash-newline joins lines; any other escaped character is itself.
      if (line[i + 1] !== "\n") word = (word ?? "") + (line[i + 1] ?? "");
      i += 2;
    } else if (c === "'" || (c === "$" && line[i + 1] === "'")) {
      const start = c === "'" ? i + 1 : i + 2;
      const end = line.indexOf("'", start);
      word = (word ?? "") + line.slice(start, end < 0 ? line.length : end);
      i = end < 0 ? line.length : end + 1;
    } else if (c === '"') {
      let j = i + 1;
      let text = "";
      while (j < line.length && line[j] !== '"') {
        if (line[j] === "\\" && '"\\$`\n'.includes(line[j + 1] ?? "")) j += 1;
        text += line[j] ?? "";
        j += 1;
      }
      word = (word ?? "") + text;
      i = j + 1;
    } else if (line.startsWith("$(", i) || c === "`") {
      const end = c === "`" ? line.indexOf("`", i + 1) : substitutionEnd(line, i + 2);
      const stop = end < 0 ? line.length : end;
      substituted.push(line.slice(i + (c === "`" ? 1 : 2), stop));
      word = (word ?? "") + UNKNOWN;
      i = stop + 1;
    } else if (c === " " || c === "\t") {
      endWord();
      i += 1;
    } else if (c === "#" && word === null) {
      const end = line.indexOf("\n", i);
      i = end < 0 ? line.length : end;
    } else {
      const operator = OPERATORS.find((op) => line.startsWith(op, i));
      if (operator) {
        endCommand();
        i += operator.length;
      } else {
        word = (word ?? "") + c;
        i += 1;
      }
    }
  }
  endCommand();
  return { commands, substituted };
}

const ASSIGNMENT = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/s;
const VARIABLE = /^\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})$/;

function basename(word) {
  return word.slice(word.lastIndexOf("/") + 1);
}

function holds(words, pattern) {
  return words.some((word, at) => {
    // A program only known when the line runs (`$(which git) push`) may be the pattern's, if the rest is.
    const dynamic = word.includes(UNKNOWN) || word.startsWith("$");
    if (basename(word) !== pattern[0] && !(dynamic && at === 0 && pattern.length > 1)) return false;
    let next = 1;
    for (const later of words.slice(at + 1)) {
      if (next < pattern.length && later === pattern[next]) next += 1;
    }
    return next === pattern.length;
  });
}

// The policy's first pattern that the line runs, or undefined.
export function sensitivePattern(line, patterns, depth = 0) {
  const wanted = patterns.map((p) => ({ p, words: p.trim().split(/\s+/).filter(Boolean) }));
  const known = new Map();
  const { commands, substituted } = simpleCommands(line);
  for (const raw of commands) {
    // Variables the line assigns earlier are what its later `$NAME` words run.
    const words = raw.map((w) => {
      const name = VARIABLE.exec(w);
      return name && known.has(name[1] ?? name[2]) ? known.get(name[1] ?? name[2]) : w;
    });
    for (const w of words) {
      const assigned = ASSIGNMENT.exec(w);
      if (assigned) known.set(assigned[1], assigned[2]);
    }
    const found = wanted.find(({ words: pattern }) => pattern.length && holds(words, pattern));
    if (found) return found.p;
    if (depth < MAX_DEPTH) {
      for (const w of words) {
        const inner = /[\s;&|`$(]/.test(w) ? sensitivePattern(w, patterns, depth + 1) : undefined;
        if (inner) return inner;
      }
    }
  }
  return depth < MAX_DEPTH
    ? substituted.map((inner) => sensitivePattern(inner, patterns, depth + 1)).find(Boolean)
    : undefined;
}
