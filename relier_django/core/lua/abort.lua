-- abort.lua: undo a push whose broker send failed (compare-and-delete).
-- Serves G4: a push that raised leaves no claim behind, so the caller can push again.
-- Deletes nothing unless the task is still exactly as push.lua left it.
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index
-- KEYS[4]  idempotency key (only for idempotent tasks)
-- ARGV[1]  task id
-- RETURNS  1 undone; 0 the task had moved on (started, or not ours), nothing touched
local id = ARGV[1]
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' or redis.call('HGET', KEYS[1], 'fence') ~= '1' then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[3], id)
if KEYS[4] and redis.call('GET', KEYS[4]) == id then
  redis.call('DEL', KEYS[4])
end
return 1
