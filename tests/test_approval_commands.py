"""Which command lines the approvals plugin holds for an operator (its `commands.mjs`, run by node).

The attack: the plugin once matched the policy's words as text, so an agent told to get around it ran
`/usr/bin/git push`, `git -C . push`, `'git' push`, `g\\it push` or `/usr/bin/sudo` unasked. Each is
held now, and so are the other ways a shell would run the same program; everyday commands are not.
"""

import json
import subprocess

from tests.conftest import ROOT

COMMANDS = ROOT / "desktops" / "agent_plugins" / "bureau-approvals" / "commands.mjs"
POLICY = ["git push", "sudo", "rm -rf"]
READ_ALL = """
const { sensitivePattern } = await import(process.argv[1]);
const { lines, policy } = JSON.parse(process.argv[2]);
console.log(JSON.stringify(lines.map((line) => sensitivePattern(line, policy) ?? null)));
"""

EVASIONS = {
    "/usr/bin/git push": "git push",
    "git -C . push origin main": "git push",
    "'git' push": "git push",
    "g\\it push": "git push",
    '"g"it push': "git push",
    "$'git' push": "git push",
    "/usr/bin/sudo apt-get install x": "sudo",
    "FOO=1 git push": "git push",
    "env GIT_TRACE=1 git push": "git push",
    "nohup git push &": "git push",
    "G=git; $G push": "git push",
    'X="git push"; $X': "git push",
    "$(which git) push": "git push",
    "`which git` push": "git push",
    "cd repo && git push": "git push",
    "true || git push": "git push",
    "(git push)": "git push",
    "git \\\n  push": "git push",
    "sh -c 'git push'": "git push",
    'bash -lc "cd repo; sudo make install"': "sudo",
    "echo $(git push)": "git push",
    "python3 -c \"import os; os.system('git push')\"": "git push",
    "eval 'rm -rf /tmp/x'": "rm -rf",
}
EVERYDAY = [
    "git status",
    "git pushed-branches",
    "pushd src",
    "grep -rn push .",
    "ls -la /tmp",
    "cat README.md | wc -l",
    "$EDITOR notes.txt",
    "sudoku --solve",
    "rm -r build",
    "echo 'git' && echo push-notes",
    "npm test # runs git hooks later, not git push itself",
]


def held(lines: list[str]) -> list[str | None]:
    answer = subprocess.run(
        [
            "node",
            "--input-type=module",
            "-e",
            READ_ALL,
            COMMANDS.as_uri(),
            json.dumps({"lines": lines, "policy": POLICY}),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(answer.stdout)


def test_the_ways_around_a_word_match_are_all_held():
    assert dict(zip(EVASIONS, held(list(EVASIONS)), strict=True)) == EVASIONS


def test_everyday_commands_are_not_held():
    assert held(EVERYDAY) == [None] * len(EVERYDAY)
