import { useCallback, useLayoutEffect, useRef } from "react";

// A reader within this many pixels of the bottom is "at the bottom".
const SLACK = 48;

// useStickToBottom keeps a scrolling box at its bottom while its content
// grows (new messages, helper panels that replay or stream after a
// refresh), as long as the reader has not scrolled up; it starts at the
// bottom. Put scroller on the box and content on its only child; stick()
// jumps back to the bottom (when the reader sends a message).
export function useStickToBottom<T extends HTMLElement>() {
  const scroller = useRef<T>(null);
  const content = useRef<HTMLDivElement>(null);
  const stuck = useRef(true);

  const toBottom = useCallback(() => {
    const el = scroller.current;
    if (el) el.scrollTop = el.scrollHeight;
  }, []);

  useLayoutEffect(() => {
    const el = scroller.current;
    const inner = content.current;
    if (!el || !inner) return;
    toBottom();
    // Scrolling sets the state only when the reader moved: growth of the
    // content (which scrolls nothing) keeps it.
    let last = el.scrollTop;
    const onScroll = () => {
      const atBottom = el.scrollHeight - el.scrollTop - el.clientHeight <= SLACK;
      if (el.scrollTop < last && !atBottom) stuck.current = false;
      else if (atBottom) stuck.current = true;
      last = el.scrollTop;
    };
    const follow = () => {
      if (stuck.current) toBottom();
      last = el.scrollTop;
    };
    el.addEventListener("scroll", onScroll, { passive: true });
    const ro = new ResizeObserver(follow);
    ro.observe(inner);
    ro.observe(el);
    return () => {
      el.removeEventListener("scroll", onScroll);
      ro.disconnect();
    };
  }, [toBottom]);

  const stick = useCallback(() => {
    stuck.current = true;
    toBottom();
  }, [toBottom]);

  return { scroller, content, stick };
}
