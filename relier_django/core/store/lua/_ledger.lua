-- _ledger.lua: not a script. scripts.py pastes it where a script says '-- @include _ledger'.
--
-- The delivery ledger that `manage.py relier_audit` reconciles: one stream per partition,
-- '<P>:ledger', named from the expiry index's key (as _limits.lua names its keys), so it
-- lives in the partition's slot. Each entry is one event, its stream id the Redis clock:
-- 'p' <id>  a task was stored (push.lua, a workflow successor made by commit.lua)
-- 'a' <id>  that store was undone because its publish failed (abort.lua): the push raised
-- Old entries are trimmed as new ones come (MINID ~: whole nodes, amortised O(1)), and the
-- key expires one horizon after the last event. A caller passes horizon_ms '' or '0' when
-- the ledger is off (AUDIT_HORIZON_S = 0); each caller notes only after its replay check,
-- so a replayed call adds nothing. A server without MINID (Redis < 6.2) keeps no ledger:
-- the event is dropped rather than the push refused.
local function ledger_note(expiry_key, horizon_ms, now_ms, id, task_key)
  local horizon = tonumber(horizon_ms or '') or 0
  if horizon <= 0 then
    return
  end
  local key = string.sub(expiry_key, 1, -8) .. ':ledger'
  local added = redis.pcall('XADD', key, 'MINID', '~', string.format('%d', now_ms - horizon),
    '*', 'p', id)
  if type(added) == 'table' and added.err then
    return
  end
  redis.call('PEXPIRE', key, string.format('%d', horizon))
  if task_key then
    redis.call('HSET', task_key, 'ledger', added)
  end
end

-- The entry ledger_note kept in the task hash, taken back (abort.lua); an emptied
-- ledger goes with it, so an undone push leaves no key.
local function ledger_forget(expiry_key, entry)
  if not entry then
    return
  end
  local key = string.sub(expiry_key, 1, -8) .. ':ledger'
  redis.call('XDEL', key, entry)
  if redis.call('XLEN', key) == 0 then
    redis.call('DEL', key)
  end
end
