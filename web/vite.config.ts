// Vite config of the playground. `npm run build` writes dist/, which is
// committed and embedded in the Go binary (embed.go); check-bundle.sh
// rebuilds it and fails when dist/ no longer matches the sources.
// `npm run dev` serves the sources with hot reload and forwards the agent
// routes to `agentry serve` on 127.0.0.1:8787.
import { defineConfig } from "vite";

export default defineConfig({
  base: "/",
  build: {
    outDir: "dist",
    emptyOutDir: true,
    sourcemap: false,
    // One predictable bundle: no preload polyfill or module-preload links
    // that would vary with the dependency graph's traversal.
    modulePreload: false,
    chunkSizeWarningLimit: 2048,
    rollupOptions: {
      onLog(level, log, handler) {
        // swr's "use client" directive means nothing in a client-only bundle.
        if (log.code === "MODULE_LEVEL_DIRECTIVE") return;
        handler(level, log);
      },
    },
  },
  server: {
    proxy: {
      "/agents": { target: "http://127.0.0.1:8787", ws: true },
    },
  },
});
