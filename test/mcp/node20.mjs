// node20.mjs lets @modelcontextprotocol/conformance 0.1.16 run on Node 20:
// its bundle imports fs.globSync (Node 22), used only by its tier report,
// which these tests do not run. Load with `node --import ./node20.mjs`.
import { register } from 'node:module';

if (!('globSync' in (await import('node:fs')))) {
  register('./node20-hooks.mjs', import.meta.url);
}
