import { useEffect, useState } from "react";

// The Assistant instance this page talks to: the URL's hash (#alice), or
// "default". Each instance has its own transcript and helper runs, so a
// new hash is a fresh playground.
export function instanceFromHash(hash: string): string {
  let name = hash.replace(/^#/, "");
  try {
    name = decodeURIComponent(name);
  } catch {
    // keep the raw text
  }
  name = name.trim();
  return name === "" || name.includes("/") ? "default" : name;
}

export function useInstanceName(): string {
  const [name, setName] = useState(() => instanceFromHash(window.location.hash));
  useEffect(() => {
    const onHash = () => setName(instanceFromHash(window.location.hash));
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);
  return name;
}

// The socket scheme follows the page's: the client's own default picks
// wss for every host that does not look local.
export const socketProtocol: "ws" | "wss" = window.location.protocol === "https:" ? "wss" : "ws";
