-- abort.lua: undo a push whose broker send failed (compare-and-delete).
-- Serves G4 (a push that raised leaves no claim behind, so the caller can push again)
-- and G1 (a store that another call was told about is never undone: two replay()s of
-- one envelope, one failing to publish, must not delete the task the other sent).
-- Deletes nothing unless the task is still exactly as push.lua left it and no other
-- call listed by push.lua still counts on it.
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index
-- KEYS[4]  metrics counters   KEYS[5]  metrics windows ('' each when metrics are off)
-- KEYS[6]  idempotency key (only for idempotent tasks)
-- ARGV[1]  task id
-- ARGV[2]  the push token the failed call gave push.lua
-- RETURNS  1 nothing of the push is left: undone now, or before (a replay of this call
--            after a lost reply finds the task gone and answers the same)
--          0 kept: the task has moved on (started, superseded) or another push of the
--            identical envelope still counts on it; nothing else touched
-- An undone store also takes back its note in the audit ledger (_ledger.lua): the push
-- raised, so relier_audit has nothing to explain.
-- Counts: an undone store takes back its 'pushed' (once: a replay finds the task gone).
-- @include _metrics
-- @include _ledger
local id = ARGV[1]
if redis.call('HDEL', KEYS[1], 'push:' .. ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'pushers', -1)
end
local f = redis.call('HMGET', KEYS[1], 'state', 'fence', 'pushers', 'created_ms')
if not f[1] then
  return 1
end
if f[1] ~= 'queued' or f[2] ~= '1' or (tonumber(f[3]) or 0) > 0 then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[3], id)
if KEYS[6] and redis.call('GET', KEYS[6]) == id then
  redis.call('DEL', KEYS[6])
end
metric_count(KEYS[4], 'pushed', -1)
ledger_forget(KEYS[3], f[4], id)  -- nothing was pushed: the audit ledger's note goes too
return 1
