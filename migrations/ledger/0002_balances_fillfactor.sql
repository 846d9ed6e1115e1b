-- Leave room on each page so that balance updates are HOT (heap-only: no index update, less WAL).
ALTER TABLE balances SET (fillfactor = 70);
