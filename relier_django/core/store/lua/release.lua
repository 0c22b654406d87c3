-- release.lua: take a DLQ entry out and re-create its task as a fresh incarnation.
-- Serves G5 (a release dispatches exactly once: of two concurrent releases, one finds
-- the entry gone) and G2 (the new incarnation's fence is above every earlier one).
-- The entry hash stays, marked 'releasing', until release_done.lua (broker accepted)
-- or release_abort.lua (broker refused: the entry goes back, the task is removed).
--
-- KEYS[1]  DLQ time index   KEYS[2]  DLQ entry hash   KEYS[3]  task hash
-- KEYS[4]  history list   KEYS[5]  expiry index   KEYS[6]  DLQ lex index
-- KEYS[7]  DLQ counts   KEYS[8]  result key
-- KEYS[9]  idempotency key (only for idempotent tasks)
-- ARGV[1]  entry id   ARGV[2]  task id
-- ARGV[3]  the new envelope, canonical JSON (fence = last fence + 1, attempt 1,
--          resurrections 0)
-- ARGV[4]  its fence   ARGV[5]  task name   ARGV[6]  queue   ARGV[7]  max resurrections
-- ARGV[8]  queued grace, ms
-- ARGV[9]  history event: JSON object without its opening brace (see start.lua)
-- ARGV[10] the fence of the failure the caller read and built ARGV[3] from (a task
--          that failed again after a release gets a new entry under the same id, with a
--          higher fence: releasing it from the older read would reuse a fence)
-- ARGV[11] request token: unique per call, the same in a replay of it
-- ARGV[12] the task's flow-control gate (model/limits.py Gate.script_arg), '' for none
--          (G14; unpartitioned stores only, as push.lua's: _limits.lua names the
--          schedule index and the scopes' keys from the expiry index's prefix)
-- RETURNS  1 re-created: publish the envelope now (a replay of this call after a lost
--            reply, found by its token on the entry, answers 1 again, so the release
--            is still published and the entry dropped)
--          2 re-created gated: due now in the schedule index, publish nothing; the
--            scanner leader dispatches it through its gate (schedule_take.lua: its
--            rate's time, then a slot, or its key's line until a slot frees), as a push
--            of a countdown. The caller drops the entry (release_done.lua). A replay
--            answers 2 again.
--          0 no such entry in the DLQ (already released, deleted, never there, or now
--            holding a later failure than the caller asked for)
--          -1 a live task with this id exists (it was pushed again meanwhile)
-- @include _dlq_index
-- @include _metrics
-- @include _limits
local gate = ARGV[12] or ''
local created = gate ~= '' and 2 or 1
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == false then
  local mark = redis.call('HMGET', KEYS[2], 'releasing', 'releasing_req')
  if mark[1] == ARGV[4] and mark[2] == ARGV[11] then
    return created
  end
  return 0
end
if redis.call('HGET', KEYS[2], 'fence') ~= ARGV[10] then
  return 0
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return -1
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local history = cjson.decode(redis.call('HGET', KEYS[2], 'history') or '[]')
for _, event in ipairs(history) do
  redis.call('RPUSH', KEYS[4], cjson.encode(event))
end
redis.call('RPUSH', KEYS[4], '{"at_ms":' .. now_ms .. ',' .. ARGV[9])
local idem = ''
if KEYS[9] and redis.call('SET', KEYS[9], ARGV[2], 'NX') then
  idem = KEYS[9]
end
local earlier = redis.call('HMGET', KEYS[2], 'first_ms', 'failures', 'partial')
-- dlq_first_ms / dlq_failures: so that a later failure of this task shows when it
-- first failed and how often (dead_letter.lua reads them).
redis.call('HSET', KEYS[3],
  'env', ARGV[3], 'fence', ARGV[4], 'state', 'queued', 'attempt', 1, 'res', 0,
  'name', ARGV[5], 'queue', ARGV[6], 'idem', idem, 'created_ms', now_ms, 'maxres', ARGV[7],
  'dlq_first_ms', earlier[1] or now_ms, 'dlq_failures', earlier[2] or 1)
if earlier[3] then
  -- The released incarnation resumes from the failed one's last checkpoint.
  redis.call('HSET', KEYS[3], 'partial', earlier[3])
end
if gate ~= '' then
  -- Not queued: no message is sent by the caller, so the expiry index does not cover
  -- it until the leader leases it at dispatch; the schedule index does until then.
  local now_text = string.format('%d', now_ms)
  limit_store_gate(KEYS[3], gate)
  redis.call('HSET', KEYS[3], 'due_ms', now_text)
  limit_schedule(limit_prefix(KEYS[5]), KEYS[3], ARGV[2], now_text)
else
  redis.call('ZADD', KEYS[5], now_ms + tonumber(ARGV[8]), ARGV[2])
end
redis.call('DEL', KEYS[8])
dlq_index_remove(KEYS[1], KEYS[6], KEYS[7], KEYS[2], ARGV[1])
redis.call('HSET', KEYS[2], 'releasing', ARGV[4], 'releasing_req', ARGV[11])
return created
