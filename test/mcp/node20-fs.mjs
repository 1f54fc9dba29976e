// node:fs with a globSync stub for Node 20 (see node20.mjs).
export * from 'node:fs';
import fs from 'node:fs';
export default fs;
export function globSync() {
  throw new Error('fs.globSync needs Node 22; not available in this shim');
}
