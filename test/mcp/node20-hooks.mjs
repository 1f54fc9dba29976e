// Module hooks for node20.mjs: the conformance bundle's "fs" resolves to
// node20-fs.mjs, which is node:fs plus a globSync that refuses.
export async function resolve(specifier, context, next) {
  if ((specifier === 'fs' || specifier === 'node:fs') && context.parentURL?.includes('/@modelcontextprotocol/conformance/')) {
    return { url: new URL('./node20-fs.mjs', import.meta.url).href, shortCircuit: true };
  }
  return next(specifier, context);
}
