import { useCallback, useEffect, useState } from "react";

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

// The hash may also carry the token a server started with
// `agentry serve --auth-token` requires: #token=… or #alice&token=….
// A fragment is never sent to the server, so the token stays out of its
// logs. parseHash splits it off; rest is the hash without it.
export function parseHash(hash: string): { name: string; token: string | null; rest: string } {
  let token: string | null = null;
  const kept: string[] = [];
  for (const part of hash.replace(/^#/, "").split("&")) {
    if (part.startsWith("token=")) {
      try {
        token = decodeURIComponent(part.slice("token=".length));
      } catch {
        token = part.slice("token=".length);
      }
    } else {
      kept.push(part);
    }
  }
  const rest = kept.join("&");
  return { name: instanceFromHash(rest), token, rest };
}

// The token lives in this tab's sessionStorage: a reload keeps it, a new
// tab or a closed browser does not.
const TOKEN_KEY = "agentry-token";

function storedToken(): string {
  try {
    return sessionStorage.getItem(TOKEN_KEY) ?? "";
  } catch {
    return "";
  }
}

function storeToken(token: string) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // storage disabled: the token lasts as long as the page
  }
}

// readAddress reads the hash. A token in it is stored and removed from the
// address bar, so it is not left in the history or in a copied link.
function readAddress(): { name: string; token: string } {
  const { name, token, rest } = parseHash(window.location.hash);
  if (token === null) return { name, token: storedToken() };
  storeToken(token);
  const url = window.location.pathname + window.location.search + (rest ? `#${rest}` : "");
  window.history.replaceState(window.history.state, "", url);
  return { name, token };
}

// usePageAddress returns the instance name and the token ("" for none),
// following hash changes; setToken replaces the token (the prompt).
export function usePageAddress(): { name: string; token: string; setToken: (token: string) => void } {
  const [address, setAddress] = useState(readAddress);
  useEffect(() => {
    const onHash = () => setAddress(readAddress());
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);
  const setToken = useCallback((token: string) => {
    storeToken(token);
    setAddress((a) => ({ ...a, token }));
  }, []);
  return { ...address, setToken };
}

// The close code of a socket the server refused (a missing or wrong
// token): the client does not reconnect, and the page asks for a token.
export const REFUSED = 4001;

// The socket scheme follows the page's: the client's own default picks
// wss for every host that does not look local.
export const socketProtocol: "ws" | "wss" = window.location.protocol === "https:" ? "wss" : "ws";
