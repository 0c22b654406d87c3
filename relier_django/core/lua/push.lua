-- push.lua: store a new task and, for idempotent tasks, claim its key, in one step.
-- Serves G1 (a task is stored, and covered by the expiry index, before it is sent)
-- and G4 (of N concurrent pushes of one idempotency key, exactly one claims it).
--
-- KEYS[1]  task hash            <p>:t:{id}
-- KEYS[2]  history list         <p>:h:{id}
-- KEYS[3]  expiry index (zset)  <p>:expiry
-- KEYS[4]  DLQ entry hash       <p>:dlq:e:{id}
-- KEYS[5]  idempotency key      <p>:i:<task>:<sha256>   (only for idempotent tasks)
-- ARGV[1]  task id
-- ARGV[2]  envelope, canonical JSON, fence 1
-- ARGV[3]  task name
-- ARGV[4]  queue
-- ARGV[5]  queued grace, ms: a stored task not started by then is re-dispatched (fenced),
--          which covers a producer that dies between this script and the broker send
-- ARGV[6]  max resurrections for this task
-- RETURNS  {1, id}        stored, fence 1 minted
--          {0, other_id}  idempotent duplicate: other_id holds the claim
--          {-1, id}       a task with this id already exists (caller-chosen id reused)
--          {-2, id}       a DLQ entry holds this id: release or delete it first (an
--                         entry and a live task never share an id)
-- Re-running the same call (a client retry after a lost reply) returns {1, id} again.
local id = ARGV[1]
local existing = redis.call('HGET', KEYS[1], 'env')
if existing then
  if existing == ARGV[2] then
    return {1, id}
  end
  return {-1, id}
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return {-2, id}
end
if KEYS[5] then
  local holder = redis.call('GET', KEYS[5])
  if holder then
    return {0, holder}
  end
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if KEYS[5] then
  -- No TTL while unfinished: commit gives it one, failure deletes it (compare-and-delete).
  redis.call('SET', KEYS[5], id)
end
redis.call('HSET', KEYS[1],
  'env', ARGV[2], 'fence', 1, 'state', 'queued', 'attempt', 1, 'res', 0,
  'name', ARGV[3], 'queue', ARGV[4], 'idem', KEYS[5] or '', 'created_ms', now_ms,
  'maxres', ARGV[6])
redis.call('ZADD', KEYS[3], now_ms + tonumber(ARGV[5]), id)
return {1, id}
