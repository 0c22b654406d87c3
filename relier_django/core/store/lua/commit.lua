-- commit.lua: fence check, result write, idempotent-result cache and clean-up, atomically.
-- Serves G2 (only the current incarnation commits: at most one result per task), G4
-- (duplicates find the cached result) and G7 (every per-task working key goes here).
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index
-- KEYS[4]  result key
-- KEYS[5]  metrics counters   KEYS[6]  metrics windows ('' each when metrics are off)
-- KEYS[7]  idempotency key ('' or absent when the task is not idempotent)
-- KEYS[8]  trail hash (only for a task that keeps one: a django.tasks task, whose
--          TaskResult shows its arguments, attempts and times after it finished):
--          the task hash, renamed, with its history and the commit time, kept as
--          long as the result
-- ARGV[1]  task id
-- ARGV[2]  fence of the committing incarnation
-- ARGV[3]  outcome record, JSON, as receipts read it; it names the committing fence
-- ARGV[4]  result TTL, ms
-- A workflow step's commit also creates the task that follows it (G1 across a workflow:
-- no moment when a step is done and its successor does not exist), given:
-- KEYS[9]  the successor's task hash   KEYS[10] the successor's result key
-- KEYS[11] the broker's queue list ('' without ARGV[11])
-- KEYS[12] that list's doorbell (transport.bell_of: rung as the message is queued, to
--          wake a worker waiting on it), '' without ARGV[11]
--          (KEYS[7] and KEYS[8] are then '' when unused)
-- KEYS[13] a chord member's commit: the chord's state hash (keys.chord)
-- ARGV[5]  successor id   ARGV[6] its envelope (fence 1)   ARGV[7] its task name
-- ARGV[8]  its queue   ARGV[9] queued grace, ms   ARGV[10] its max resurrections
-- ARGV[11] '' or its broker message, as kombu's Redis transport would LPUSH it (the
--          caller publishes when ''; the queued grace covers a publish that is lost)
-- ARGV[12] with KEYS[13]: this member's index in the header; ARGV[13] its result, JSON;
--          ARGV[14] how long the chord's state is kept, ms, until it is sealed
-- A chain's successor (no KEYS[13]) is always created. A chord's callback is created by
-- the commit that completes the header: this member's result is recorded under its
-- index (once: a member commits once, whatever its redeliveries), and when the header
-- size is known ('size', written by the producer before the last member is pushed) and
-- every member's result is in, the first such commit creates it ('fired': its task id).
-- The successor is stored queued, fence 1, in the expiry index, as push.lua stores a
-- task; once only: a successor id that already has a task or a result is left alone.
-- RETURNS  {1, created}        committed (also to a replay of this call after a lost
--                              reply: the task is gone and its result is this record,
--                              which only this fence's one running copy can write);
--                              created: 1 when this call created a successor, else 0
--                              (a replay reads it back: the successor, or 'fired'
--                              naming this member, is there)
--          {0, current_fence}  rejected: the fence moved (-1: the task is gone); no
--                              successor is created
-- ARGV[15] the successor's flow-control gate ('' or absent: none; model/limits.py
--          Gate.script_arg, ARGV[12..14] '' for a chain's): a gated successor is stored
--          as push.lua stores a gated push, never queued here: it takes a slot of its
--          scope or waits in its key's line, and the scanner leader dispatches it
--          through its rate (schedule_take.lua), so a workflow's step keeps its limits.
-- Celery's link= (callbacks, any number, created with the commit as a chain's step is):
-- ARGV[16] n, the number of callbacks (absent: 0); with n > 0, ARGV[5..15] and
--          KEYS[7..13] are all given ('' each when unused: no successor, no chord)
-- ARGV[17+6i .. 22+6i] callback i (0-based): its id, its envelope (fence 1), its task
--          name, its queue, its max resurrections, its flow-control gate ('' for none)
-- KEYS[14+2i], KEYS[15+2i] callback i's task hash and result key
-- Each callback is created once, as _links.lua says (stored due now for the scanner
-- leader's dispatch), by the call that commits; a replay creates nothing more.
-- ARGV[17+6n] the audit ledger's horizon, ms ('' or absent: off; with it, ARGV[5..16]
--          are all given, '' or 0 when unused): a successor created is noted in the
--          ledger (_ledger.lua)
-- A hand-over (partitioned store: the successor and callbacks live in other partitions,
-- which one script cannot reach on a cluster; store/handover.py): ARGV[5..15] '', n = 0,
-- ARGV[17] '' or the ledger's horizon, and
-- ARGV[18] '' or the hand-over record (JSON: the tasks this commit brings about), kept
--          under this task's id in KEYS[15] and indexed by the commit time in KEYS[14]
--          (handover_store.lua stores each task, handover_done.lua forgets the record)
-- KEYS[14] the partition's hand-over index   KEYS[15] its hand-over records
-- A gated task's slot is freed and handed to the next parked task (_limits.lua, G14).
-- Counts: 'committed' and the minute's and hour's 'ok' once per task; 'stale' per refused
-- call (a zombie's commit; a client retry of a refused call counts again).
-- @include _metrics
-- @include _clock
-- @include _limits
-- @include _links
-- @include _ledger
local id = ARGV[1]
local chord_key = (KEYS[13] and KEYS[13] ~= '') and KEYS[13] or nil
local first_next = (ARGV[5] and ARGV[5] ~= '') and ARGV[5] or nil
local fields = redis.call('HMGET', KEYS[1], 'fence', 'state', 'lim')
if fields[1] ~= ARGV[2] or fields[2] ~= 'running' then
  if not fields[1] and redis.call('GET', KEYS[4]) == ARGV[3] then
    -- A replay: whether the first call created the successor is still readable.
    local created = 0
    if first_next and chord_key then
      created = redis.call('HGET', chord_key, 'fired') == id and 1 or 0
    elseif first_next then
      created = (redis.call('EXISTS', KEYS[9]) + redis.call('EXISTS', KEYS[10]) > 0) and 1 or 0
    end
    return {1, created}
  end
  metric_count(KEYS[5], 'stale')
  return {0, tonumber(fields[1]) or -1}
end
local ttl = ARGV[4]
redis.call('SET', KEYS[4], ARGV[3], 'PX', ttl)
if KEYS[7] and KEYS[7] ~= '' and redis.call('GET', KEYS[7]) == id then
  redis.call('PEXPIRE', KEYS[7], ttl)
end
local now_ms, now_text = clock()
if fields[3] and fields[3] ~= '' then
  -- Its slot freed, and handed to the next parked task of its scope (G14).
  limit_release(limit_prefix(KEYS[3]), KEYS[1], id, now_text, KEYS[5])
end
if KEYS[8] and KEYS[8] ~= '' then
  local history = redis.call('LRANGE', KEYS[2], 0, -1)
  redis.call('RENAME', KEYS[1], KEYS[8])
  redis.call('HSET', KEYS[8], 'state', 'committed', 'done_ms', now_text,
    'history', '[' .. table.concat(history, ',') .. ']')
  redis.call('PEXPIRE', KEYS[8], ttl)
  redis.call('DEL', KEYS[2])
else
  redis.call('DEL', KEYS[1], KEYS[2])
end
redis.call('ZREM', KEYS[3], id)
local next_id = first_next
local created = 0
if next_id and chord_key then
  local chord = chord_key
  local fresh = redis.call('EXISTS', chord) == 0
  redis.call('HSET', chord, 'r:' .. ARGV[12], ARGV[13])
  -- A state sealed once every member existed (chords.seal: no TTL) stays so; before,
  -- a header that may never complete (its producer died part-way) expires.
  if fresh or redis.call('PTTL', chord) >= 0 then
    redis.call('PEXPIRE', chord, tonumber(ARGV[14]))
  end
  local meta = redis.call('HMGET', chord, 'size', 'fired')
  local size = tonumber(meta[1] or '')
  local results = redis.call('HLEN', chord) - 1 - (meta[2] and 1 or 0)
  if size and results >= size and not meta[2] then
    redis.call('HSET', chord, 'fired', id)  -- by this member: a replay reads it back
  else
    next_id = nil  -- the header is not complete yet (or another commit completed it)
  end
end
if next_id and redis.call('EXISTS', KEYS[9]) == 0 and redis.call('EXISTS', KEYS[10]) == 0 then
  redis.call('HSET', KEYS[9],
    'env', ARGV[6], 'fence', '1', 'state', 'queued', 'attempt', '1', 'res', '0',
    'name', ARGV[7], 'queue', ARGV[8], 'idem', '', 'created_ms', now_text,
    'maxres', ARGV[10], 'pushers', '1')
  local gate = ARGV[15] or ''
  if gate ~= '' then
    local scope, key, capacity = limit_store_gate(KEYS[9], gate)
    redis.call('HSET', KEYS[9], 'due_ms', now_text)
    local prefix = limit_prefix(KEYS[3])
    if scope == '' or limit_take_slot(prefix, KEYS[9], next_id, scope, key, capacity, '1',
        now_ms, KEYS[5]) then
      limit_schedule(prefix, KEYS[9], next_id, now_text)
    end
  else
    redis.call('ZADD', KEYS[3], ms(now_ms + tonumber(ARGV[9])), next_id)
    if ARGV[11] ~= '' then
      redis.call('LPUSH', KEYS[11], ARGV[11])
      redis.call('ZADD', KEYS[12], '0', 'ring')
    end
  end
  metric_count(KEYS[5], 'pushed')
  ledger_note(KEYS[3], ARGV[17 + 6 * (tonumber(ARGV[16] or '0') or 0)], now_ms, next_id)
  created = 1
end
local links = tonumber(ARGV[16] or '0') or 0
for i = 0, links - 1 do
  local a = 17 + 6 * i
  link_create(KEYS[3], KEYS[14 + 2 * i], KEYS[15 + 2 * i], ARGV[a], ARGV[a + 1], ARGV[a + 2],
    ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], now_ms, now_text, KEYS[5])
end
-- Hand-over: recorded with the commit, so no moment has the step done and its
-- successors neither stored nor recorded (G1 across partitions).
local handover = ARGV[18 + 6 * links]
if handover and handover ~= '' then
  redis.call('ZADD', KEYS[14 + 2 * links], now_text, id)
  redis.call('HSET', KEYS[15 + 2 * links], id, handover)
end
metric_count(KEYS[5], 'committed')
if KEYS[6] ~= '' then
  metric_window(KEYS[6], now_ms, 'ok')
end
return {1, created}
